//! Consistency checks of the whole model, in the spirit of CONFIG_DEBUG_VM's
//! VM_BUG_ON_FOLIO: the page tables of every process are walked and what
//! they map is compared with the folio metadata and the counters.
//!
//! No kernel file: hugelab's own checker. The invariants are Linux 6.18's,
//! as the files the other modules follow keep them (mm/rmap.c for the
//! mapcounts, mm/huge_memory.c for the deferred split queue, mm/vmstat.c for
//! the counters); the kernel asserts them one at a time
//! (`include/linux/mmdebug.h`), never as a whole walk.
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
//! each of its pages is mapped only where its VMA's page offset is its
//! folio's index (plus the page's offset: `vma_address`) and only by mms
//! its anon_vma's tree reaches, so rmap walks miss
//! nothing; each anon_vma counts the large folios pointing at it, is linked
//! both ways with its parent, and is marked live exactly while its mm is.
//! The task list and the mm table (see `mms`): every task's mm exists, and
//! every mm in the table has a task (an mm whose last task exited is torn
//! down and freed; threads share one mm).
//! Each process's cached readings (`reading_cache`), where still taken as
//! fresh, equal a fresh computation.
//! Page cache pages (`filemap`): each is order 0, not anonymous, its
//! mapcount the PTEs found mapping it and its refcount one more (the page
//! cache's); their frames count as in use for as long as the run.
//! With no process left, every frame but the huge zero folio and the page
//! cache is free.
//! Slow (a full walk): for tests and `--check`, not for benchmarks.

use crate::mm_types::{
    pg, MmId, Pfn, HPAGE_PMD_NR, HPAGE_PMD_ORDER, MM_ID_DUMMY, PAGE_SIZE, PMD_SIZE,
};
use crate::pgtable::Pmd;
use crate::rmap::{self, GUP_PIN_COUNTING_BIAS};
use crate::sparse::page_folio;
use crate::vmstat::MthpStat;
use crate::{Machine, Model};
use std::collections::{BTreeMap, BTreeSet};

/// Every broken invariant, one sentence each; empty when all hold.
pub fn check(model: &Model) -> Vec<String> {
    let m = &model.machine;
    let mut bad = Vec::new();
    check_lru(m, &mut bad);
    check_memcg(m, &mut bad);
    check_tasks(m, &mut bad);
    let mut walk = walk_page_tables(m, &mut bad);
    let found = check_folios(model, &mut walk, &mut bad);
    check_queue_and_mm_ids(m, &found.folios, &mut bad);
    check_stats(m, &walk, &found, &mut bad);
    check_anon_vmas(model, &found.folios, &walk.placed, &mut bad);
    bad.extend(
        model
            .reading_cache
            .stale(m, &m.tasks, crate::counters::process_counters),
    );
    let names: Vec<(String, &crate::mm_types::MmStruct)> =
        m.mms.iter().map(|mm| (mm_name(m, mm.mm_id), mm)).collect();
    crate::hugetlb::check(m, names.iter().map(|(n, mm)| (n.as_str(), *mm)), &mut bad);
    let zero = m.huge_zero_folio.map_or(0, |_| HPAGE_PMD_NR);
    let hugetlb = m.hugetlb.frames() + m.vmemmap.zone_frames();
    let cache = check_page_cache(m, &walk, &mut bad);
    let used = found.frames + walk.tables as u64 + zero + hugetlb + m.unmovable_pages + cache;
    let total = m.zone.spanned_pages();
    if used + m.zone.nr_free_pages() != total {
        bad.push(format!(
            "{used} frames in use and {} free, but the zone has {total}",
            m.zone.nr_free_pages()
        ));
    }
    bad
}

/// LRU state (swap): only folios in use have one, and a lazily-freed folio
/// is anon (it may be active: reclaim activates one it cannot unmap, a
/// pinned one, without making it swapbacked).
fn check_lru(m: &Machine, bad: &mut Vec<String>) {
    for (folio, e) in m.lru.entries() {
        let p = m.zone.memmap.page(folio);
        if !p.test(pg::HEAD) || p.test(pg::BUDDY) {
            bad.push(format!("{folio} has LRU state but is no folio in use"));
        } else if e.flags & crate::swap::LAZYFREE != 0 && !p.test(pg::ANON) {
            bad.push(format!("lazily-freed {folio} is not anon"));
        }
    }
}

/// memcontrol: every group's usage is what is charged to it, and only
/// pages in use are charged.
fn check_memcg(m: &Machine, bad: &mut Vec<String>) {
    for (g, usage) in crate::memcontrol::recount(m).into_iter().enumerate() {
        let group = &m.memcg.groups[g];
        if group.memory.usage != usage {
            bad.push(format!(
                "memcg {}: usage {} pages, charged pages {usage}",
                group.name, group.memory.usage
            ));
        }
    }
    for (g, group) in m.memcg.groups.iter().enumerate() {
        let kmem = m
            .memcg
            .charged()
            .filter(|&(p, c, _)| c == g && m.memcg.is_kmem(p));
        if group.kmem != kmem.count() as u64 {
            bad.push(format!(
                "memcg {}: kmem {} pages, charged page tables differ",
                group.name, group.kmem
            ));
        }
    }
    for (pfn, _, _) in m.memcg.charged() {
        if m.zone.memmap.page(pfn).test(pg::BUDDY) {
            bad.push(format!("{pfn} is free but still charged to a memcg"));
        }
    }
}

/// What the page tables of every mm map.
#[derive(Default)]
struct Walk {
    pte_maps: BTreeMap<Pfn, u32>,
    /// PTE mappings of page cache pages (filemap).
    file_maps: BTreeMap<Pfn, u32>,
    pmd_maps: BTreeMap<Pfn, u32>,
    /// Page-table pages found.
    tables: i64,
    /// Mappings (PTEs plus PMDs) of each folio by each MM.
    by_mm: BTreeMap<Pfn, BTreeMap<MmId, u64>>,
    /// Where each page of a large folio is mapped: (mm, page, address,
    /// the page offset the address has in its VMA if it lies in one).
    placed: Vec<(MmId, Pfn, u64, Option<u64>)>,
}

/// Walks the page tables of every mm once (threads share theirs); checks
/// each mm's tables lie in VMAs and its MM_ANONPAGES.
fn walk_page_tables(m: &Machine, bad: &mut Vec<String>) -> Walk {
    let mut w = Walk::default();
    let total: u64 = m.mms.iter().map(|mm| mm.anon_rss).sum();
    if total != m.stat.rss_anon {
        bad.push(format!(
            "the sum of MM_ANONPAGES is {total} but the machine counts {}",
            m.stat.rss_anon
        ));
    }
    for mm in m.mms.iter() {
        let name = || mm_name(m, mm.mm_id);
        let mut rss = 0u64;
        w.tables += (mm.pmd_tables.len() + mm.pud_tables.len()) as i64;
        for (index, pmd) in mm.pmds.range(0..=u64::MAX) {
            w.tables += 1;
            match pmd {
                Pmd::Huge { pfn, .. } => {
                    *w.pmd_maps.entry(*pfn).or_default() += 1;
                    *w.by_mm
                        .entry(*pfn)
                        .or_default()
                        .entry(mm.mm_id)
                        .or_default() += 1;
                    let addr = index * PMD_SIZE;
                    let pgoff = mm.find_vma(addr).map(|v| v.linear_page_index(addr));
                    w.placed.push((mm.mm_id, *pfn, addr, pgoff));
                    rss += HPAGE_PMD_NR;
                }
                Pmd::HugeZero { .. } => {}
                Pmd::Table(t) => {
                    for (i, pte) in t.ptes.iter().enumerate() {
                        let Some(pfn) = pte.pfn() else { continue };
                        if !m.zone.memmap.page(pfn).test(pg::ANON) {
                            *w.file_maps.entry(pfn).or_default() += 1;
                            continue;
                        }
                        *w.pte_maps.entry(pfn).or_default() += 1;
                        let folio = page_folio(m, pfn);
                        *w.by_mm
                            .entry(folio)
                            .or_default()
                            .entry(mm.mm_id)
                            .or_default() += 1;
                        if m.zone.memmap.page(folio).order() > 0 {
                            let addr = index * PMD_SIZE + i as u64 * PAGE_SIZE;
                            let pgoff = mm.find_vma(addr).map(|v| v.linear_page_index(addr));
                            w.placed.push((mm.mm_id, pfn, addr, pgoff));
                        }
                        rss += 1;
                    }
                }
            }
            let (lo, hi) = (index * PMD_SIZE, (index + 1) * PMD_SIZE);
            if mm.vmas_in(lo, hi).is_empty() {
                bad.push(format!("{}: a page table at {lo:#x} with no VMA", name()));
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
    w
}

/// Every page cache page against the PTEs found mapping it; returns how
/// many frames the page cache holds.
fn check_page_cache(m: &Machine, walk: &Walk, bad: &mut Vec<String>) -> u64 {
    let mut frames = 0;
    for page in m.page_cache.all_pages() {
        frames += 1;
        let p = m.zone.memmap.page(page);
        let maps = walk.file_maps.get(&page).copied().unwrap_or(0);
        if !p.is_small_folio() || p.test(pg::ANON) {
            bad.push(format!(
                "{page}: a page cache page that is no order-0 file folio"
            ));
        }
        if u32::from(p.mapcount) != maps || p.private != maps + 1 {
            bad.push(format!(
                "{page}: page cache page with mapcount {} and refcount {} but {maps} PTEs map it",
                p.mapcount, p.private
            ));
        }
    }
    if walk.file_maps.len() as u64 > frames {
        bad.push("a PTE maps a non-anonymous page outside the page cache".to_string());
    }
    frames
}

/// What the folios mapped or pinned add up to.
#[derive(Default)]
struct Found {
    folios: BTreeSet<Pfn>,
    anon_mapped: i64,
    anon_thps: i64,
    frames: u64,
    /// Per order: (nr_anon, nr_anon_partially_mapped).
    per_size: [(i64, i64); HPAGE_PMD_ORDER as usize + 1],
}

/// Every folio mapped or pinned, against its mappings and pins.
fn check_folios(model: &Model, walk: &mut Walk, bad: &mut Vec<String>) -> Found {
    let m = &model.machine;
    let mut pins: BTreeMap<Pfn, u32> = BTreeMap::new();
    for pin in &model.pins {
        for page in &pin.pages {
            *pins.entry(page_folio(m, *page)).or_default() += 1;
        }
    }
    let mut folios: BTreeSet<Pfn> = pins.keys().copied().collect();
    folios.extend(walk.pmd_maps.keys().copied());
    folios.extend(walk.pte_maps.keys().map(|p| page_folio(m, *p)));
    let mut found = Found::default();
    let queue: BTreeSet<Pfn> = m.deferred_split_queue.iter().collect();
    for &folio in &folios {
        let head = m.zone.memmap.page(folio);
        if !head.test(pg::HEAD) || head.test(pg::BUDDY) {
            bad.push(format!("{folio} is mapped or pinned but is no folio"));
            continue;
        }
        let pinned = pins.get(&folio).copied().unwrap_or(0);
        check_folio(m, folio, walk, pinned, &mut found, bad);
        let order = head.order();
        if order > 0 {
            let mms = walk.by_mm.remove(&folio).unwrap_or_default();
            check_large_folio(model, folio, &mms, &queue, bad);
            found.per_size[order as usize].0 += 1;
            found.per_size[order as usize].1 += i64::from(head.test(pg::PARTIALLY_MAPPED));
        }
    }
    found.folios = folios;
    found
}

/// One folio's mapcounts, refcount and PageAnonExclusive against the
/// mappings found and its `pinned` pins; adds to `found`'s counts.
fn check_folio(
    m: &Machine,
    folio: Pfn,
    walk: &Walk,
    pinned: u32,
    found: &mut Found,
    bad: &mut Vec<String>,
) {
    let order = m.zone.memmap.page(folio).order();
    let nr = 1u64 << order;
    found.frames += nr;
    let entire = walk.pmd_maps.get(&folio).copied().unwrap_or(0);
    let mut ptes = 0u64;
    let mut mapped_pages = 0u32;
    for i in 0..nr {
        let page = Pfn(folio.0 + i);
        let maps = walk.pte_maps.get(&page).copied().unwrap_or(0);
        let stored = u32::from(m.zone.memmap.page(page).mapcount);
        if maps != stored {
            bad.push(format!("{page}: mapcount {stored} but {maps} PTEs map it"));
        }
        ptes += u64::from(maps);
        mapped_pages += u32::from(maps > 0);
        found.anon_mapped += i64::from(maps > 0 || entire > 0);
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
            found.anon_thps += nr as i64;
        }
    }
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
        let maps = walk.pte_maps.get(&page).copied().unwrap_or(0) + if i == 0 { entire } else { 0 };
        // A PMD-mappable folio keeps the flag on its head while PMD-mapped.
        let meaningful = order != HPAGE_PMD_ORDER || entire == 0 || i == 0;
        if meaningful && maps > 1 && m.zone.memmap.page(page).test(pg::ANON_EXCLUSIVE) {
            bad.push(format!("{page}: PageAnonExclusive but mapped {maps} times"));
        }
    }
}

/// The deferred split queue and the MM-ID slots hold only folios in use.
fn check_queue_and_mm_ids(m: &Machine, folios: &BTreeSet<Pfn>, bad: &mut Vec<String>) {
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
}

/// The vmstat counters against what was found.
fn check_stats(m: &Machine, walk: &Walk, found: &Found, bad: &mut Vec<String>) {
    for order in 2..=HPAGE_PMD_ORDER {
        let (anon, partial) = found.per_size[order as usize];
        for (stat, n) in [
            (MthpStat::NrAnon, anon),
            (MthpStat::NrAnonPartiallyMapped, partial),
        ] {
            let stored = m.stat.mthp_stat(order, stat);
            if stored != n {
                bad.push(format!(
                    "{}kB {}: {stored} but {n} folios found",
                    4u64 << order,
                    stat.name()
                ));
            }
        }
    }
    if found.anon_mapped != m.stat.nr_anon_mapped {
        bad.push(format!(
            "NR_ANON_MAPPED {} but {} pages mapped",
            m.stat.nr_anon_mapped, found.anon_mapped
        ));
    }
    if found.anon_thps != m.stat.nr_anon_thps {
        bad.push(format!(
            "NR_ANON_THPS {} but {} pages PMD-mapped",
            m.stat.nr_anon_thps, found.anon_thps
        ));
    }
    // Each PMD entry holds one table page: its PTE table or the deposited one.
    if walk.tables != m.stat.nr_pagetable {
        bad.push(format!(
            "NR_PAGETABLE {} but {} tables found",
            m.stat.nr_pagetable, walk.tables
        ));
    }
}

/// Every task's mm exists; every mm has a task.
fn check_tasks(m: &Machine, bad: &mut Vec<String>) {
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
fn mm_name(m: &Machine, id: MmId) -> String {
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
    placed: &[(MmId, Pfn, u64, Option<u64>)],
    bad: &mut Vec<String>,
) {
    let m = &model.machine;
    let mut tree = Vec::new();
    for &(mm, page, addr, pgoff) in placed {
        let folio = page_folio(m, page);
        let ext = m.zone.memmap.folio_ext(folio);
        let expected = ext.index + (page.0 - folio.0);
        if pgoff != Some(expected) {
            bad.push(format!(
                "{page} is mapped at {addr:#x} (page offset {pgoff:?} of its VMA) \
                 but its folio's index puts it at page offset {expected:#x}"
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
    fn an_mm_without_a_task_and_a_task_without_an_mm_are_caught() {
        let mut model = forked_64k();
        let b = model.machine.tasks.remove("b").unwrap();
        assert_caught(&model, "has no task but was not torn down");
        model.machine.tasks.insert("b".into(), b);
        model.machine.tasks.get_mut("b").unwrap().mm = 99;
        assert_caught(&model, "b: its mm 99 does not exist");
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
