//! Reverse-map accounting: mapcounts of folios and pages, the per-MM
//! mapcounts that tell whether a large folio is mapped by more than one
//! process, and the anon statistics that follow them (NR_ANON_MAPPED,
//! NR_ANON_THPS, per-size nr_anon).
//!
//! Follows Linux 6.18 `mm/rmap.c` and `include/linux/rmap.h` with
//! CONFIG_PAGE_MAPCOUNT=y and CONFIG_MM_ID=y: `_entire_mapcount` counts PMD
//! mappings, each page's `_mapcount` its PTE mappings, `_nr_pages_mapped` the
//! pages mapped by at least one PTE, and `_large_mapcount` with the two
//! `_mm_id` slots and FOLIO_MM_IDS_SHARED_BIT tracks which MMs map a large
//! folio (`folio_add_return_large_mapcount`, `folio_sub_return_large_mapcount`).
//!
//! The reverse map of a large folio is what the kernel's is: its anon_vma
//! and its index (`FolioExt`). `rmap_walk_anon` visits the mm of that
//! anon_vma and of every anon_vma forked from it, and in each VMA whose
//! page offsets cover the folio's index looks at the one address where it
//! can map the folio (`vma_address`), so splitting a folio or remapping
//! its zero-filled pages costs the mms of one fork family, not a walk of
//! every page table of every process.
//!
//! The order of that walk is the kernel's: `anon_vma_interval_tree_foreach`
//! meets the VMAs by start pgoff, then in the order their anon_vma_chains
//! were inserted (an equal key goes right), so a parent's VMA comes before
//! its forked child's until a split or merge re-inserts it (mm/vma.c
//! `vma_prepare`/`vma_complete`); `try_to_migrate` unmaps a folio to be
//! split in that order and replays `__folio_remove_rmap` on the way. The
//! walk goes on past a PMD it split: that is 6.18.y with the stable fix
//! "mm/huge_memory: fix early failure try_to_migrate() when split huge pmd
//! for shared THP" (this project's machines run 6.18.44); before it, the
//! walk stopped after the first PMD and the shared split failed.
//!
//! Simplifications: one anon_vma per mm instead of one per VMA with
//! anon_vma_chain links (`AnonVma`, named by its mm's id): a folio of an
//! mm's anon_vma is mapped, in that mm or in mms forked from it, by VMAs
//! whose page offsets cover its index (`mm_types::FolioExt::index`), at
//! `vma_address`, which is what the kernel's interval tree of VMAs under
//! the anon_vma yields too; the model's walk may also visit a VMA of those
//! mms that the kernel's anon_vma does not link (its offsets cover the
//! index but it maps other memory), where, as in the kernel's
//! page_vma_mapped_walk, the page tables do not map the folio. The tree
//! itself is not kept: the walk collects the VMAs of those mms whose
//! offsets overlap the folio's and sorts them by start pgoff and by an
//! insertion sequence number (`AnonVmas::avc_seq`):
//! the fork's for every VMA of a child, a newer one for a VMA split or
//! merged since; a VMA of the family's first mm that never changed ranks
//! first (its anon_vma_prepare came before any fork that linked a child). Only large folios record their
//! anon_vma and index: nothing walks the rmap of an order-0 folio in the
//! model (no reclaim, migration or KSM). The MM-ID slots of
//! a large folio live in a side table (`Machine::folio_mm_ids`) and only while
//! the folio is mapped by more than one MM or still marked shared: a folio
//! without an entry is mapped exclusively by the one MM that maps it, which
//! is the state the kernel's slots return to (slot order aside, which only
//! decides which free slot a third MM takes).

use crate::deferred_split::deferred_split_folio;
use crate::mm_types::{pg, MmId, Pfn, HPAGE_PMD_NR, MM_ID_DUMMY, PAGE_SHIFT, PAGE_SIZE, PMD_SIZE};
use crate::mms::MmList;
use crate::pgtable::{folio_pte_spans, Pmd};
use crate::vmstat::MthpStat;
use crate::Machine;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// GUP_PIN_COUNTING_BIAS: what one pin adds to a small folio's refcount.
pub const GUP_PIN_COUNTING_BIAS: u32 = 1024;

/// The `_mm_id[2]`, `_mm_id_mapcount[2]` and FOLIO_MM_IDS_SHARED_BIT of a
/// large folio mapped by more than one MM. Mapcounts are plain counts here
/// (the kernel stores them minus one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FolioMmIds {
    pub mm_id: [MmId; 2],
    pub mapcount: [u64; 2],
    pub shared: bool,
}

/// An anon_vma: one per mm in the model (see the module doc), named by the
/// id of the mm that made it, linked to the anon_vma of the mm it was forked
/// from. It lives while its mm lives, a large folio points at it, or an
/// anon_vma forked from it lives (the kernel's anon_vma refcount and
/// `num_children`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnonVma {
    pub parent: Option<MmId>,
    /// The anon_vmas forked from this one, oldest first.
    pub children: Vec<MmId>,
    /// Whether its mm is alive.
    pub mm_alive: bool,
    /// Large folios whose `folio->mapping` it is.
    pub folios: u64,
    /// When its mm's VMAs were linked into the anon_vma interval trees of
    /// their family: 0 for the mm that made the family's anon_vma (linked
    /// at anon_vma_prepare, before any child), else the fork's sequence
    /// number (`anon_vma_fork`); see `AnonVmas::avc_seq`.
    pub avc_forked: u64,
    /// VMAs of its mm (by start address) whose avcs were removed and
    /// inserted again since, by a VMA split or merge, with that sequence
    /// number.
    pub avc_moved: BTreeMap<u64, u64>,
}

/// Every anon_vma of the machine, by id.
#[derive(Default)]
pub struct AnonVmas {
    map: HashMap<MmId, AnonVma>,
    /// The sequence number of the next avc insertion.
    next_avc: u64,
}

impl AnonVmas {
    /// anon_vma_prepare for a new mm (spawn).
    pub fn alloc(&mut self, mm: MmId) {
        self.map.insert(
            mm,
            AnonVma {
                mm_alive: true,
                ..AnonVma::default()
            },
        );
    }

    /// anon_vma_fork: the child's anon_vma, under the parent's; the
    /// child's VMAs are linked after every avc already in the trees.
    pub fn fork(&mut self, parent: MmId, child: MmId) {
        self.next_avc += 1;
        self.map.insert(
            child,
            AnonVma {
                parent: Some(parent),
                mm_alive: true,
                avc_forked: self.next_avc,
                ..AnonVma::default()
            },
        );
        if let Some(p) = self.map.get_mut(&parent) {
            p.children.push(child);
        }
    }

    /// The mm of `id` exited (unlink_anon_vmas).
    pub fn exit(&mut self, id: MmId) {
        if let Some(av) = self.map.get_mut(&id) {
            av.mm_alive = false;
            av.avc_moved.clear();
        }
        self.put(id);
    }

    /// A large folio takes `id` as its anon_vma.
    pub fn get_folio(&mut self, id: MmId) {
        self.map.get_mut(&id).expect("a live anon_vma").folios += 1;
    }

    /// A large folio of anon_vma `id` was freed or split.
    pub fn put_folio(&mut self, id: MmId) {
        let av = self.map.get_mut(&id).expect("a folio's anon_vma");
        av.folios -= 1;
        self.put(id);
    }

    /// Frees `id` and then its parents while nothing holds them.
    fn put(&mut self, mut id: MmId) {
        loop {
            let Some(av) = self.map.get(&id) else { return };
            if av.mm_alive || av.folios > 0 || !av.children.is_empty() {
                return;
            }
            let parent = av.parent;
            self.map.remove(&id);
            let Some(p) = parent else { return };
            let siblings = &mut self.map.get_mut(&p).expect("a parent anon_vma").children;
            let at = siblings.iter().position(|&c| c == id).expect("linked");
            siblings.remove(at);
            id = p;
        }
    }

    pub fn get(&self, id: MmId) -> Option<&AnonVma> {
        self.map.get(&id)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The ids of the anon_vmas in the tree under `id` (itself included),
    /// depth first, into `out`: the mms an rmap walk from `id` visits.
    pub fn tree(&self, id: MmId, out: &mut Vec<MmId>) {
        out.clear();
        out.push(id);
        let mut i = 0;
        while i < out.len() {
            if let Some(av) = self.map.get(&out[i]) {
                out.extend_from_slice(&av.children);
            }
            i += 1;
        }
    }

    /// anon_vma_interval_tree_post_update_vma (a VMA split or merged keeps
    /// its avcs but takes them out of the trees and inserts them again) and
    /// anon_vma_clone of a split's new VMA: the VMA of `mm` at `start` now
    /// comes after every avc of the same start already in the trees.
    pub fn avc_reinsert(&mut self, mm: MmId, start: u64) {
        self.next_avc += 1;
        if let Some(av) = self.map.get_mut(&mm) {
            av.avc_moved.insert(start, self.next_avc);
        }
    }

    /// unlink_anon_vmas of one VMA (munmap): a later VMA at its start is
    /// linked afresh.
    pub fn avc_unlink(&mut self, mm: MmId, start: u64) {
        if let Some(av) = self.map.get_mut(&mm) {
            av.avc_moved.remove(&start);
        }
    }

    /// When the avcs of `mm`'s VMA at `start` were inserted: the tie-break
    /// of the interval tree between VMAs of one start (an equal key is
    /// inserted to the right, so the in-order walk meets equal keys in
    /// insertion order).
    pub fn avc_seq(&self, mm: MmId, start: u64) -> u64 {
        self.map.get(&mm).map_or(0, |av| {
            av.avc_moved.get(&start).copied().unwrap_or(av.avc_forked)
        })
    }

    /// The root of the tree holding `id` (the fork family's first mm).
    pub fn root(&self, mut id: MmId) -> MmId {
        while let Some(p) = self.map.get(&id).and_then(|av| av.parent) {
            id = p;
        }
        id
    }
}

/// rmap_walk_anon's anon_vma part: the live mms of the tree of the
/// anon_vma of `folio` (a large anon folio), the mms whose VMAs
/// `anon_vma_interval_tree_foreach` looks at.
pub fn rmap_walk_anon(m: &Machine, folio: Pfn) -> Vec<MmId> {
    let ext = m.zone.memmap.folio_ext(folio);
    let mut ids = Vec::new();
    m.anon_vmas.tree(ext.anon_vma, &mut ids);
    ids.retain(|id| m.anon_vmas.get(*id).is_some_and(|av| av.mm_alive));
    ids
}

/// One VMA an rmap walk of a folio visits: its mm, its range, and where
/// the folio's first page is in it (`vma_address` of `folio->index` before
/// its clamping: below `start` when the VMA maps only a tail of the folio).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvcVisit {
    pub mm: MmId,
    pub start: u64,
    pub end: u64,
    pub addr: u64,
}

impl AvcVisit {
    /// The folio's pages (of `nr`) whose addresses in this VMA lie inside it.
    pub fn pages(&self, nr: usize) -> std::ops::Range<usize> {
        let page = |a: u64| (a.wrapping_sub(self.addr) / PAGE_SIZE).min(nr as u64) as usize;
        let lo = if self.start > self.addr {
            page(self.start)
        } else {
            0
        };
        lo..page(self.end).max(lo)
    }

    /// The PTE tables holding this VMA's part of the folio: (PMD index, PTE
    /// index of its first page there, the folio's pages `[lo, hi)` in it),
    /// as `pgtable::folio_pte_spans` gives them.
    pub fn pte_spans(&self, nr: usize) -> impl Iterator<Item = (u64, usize, usize, usize)> {
        let pages = self.pages(nr);
        let base = self.addr.wrapping_add(pages.start as u64 * PAGE_SIZE);
        folio_pte_spans(base, pages.len())
            .map(move |(index, first, lo, hi)| (index, first, lo + pages.start, hi + pages.start))
    }

    /// Whether this VMA can map the whole folio by the PMD at `addr`.
    pub fn holds_pmd(&self) -> bool {
        self.addr.is_multiple_of(PMD_SIZE)
            && self.start <= self.addr
            && self.addr + PMD_SIZE <= self.end
    }
}

/// anon_vma_interval_tree_foreach over the anon_vma of `folio` (a large
/// anon folio), as rmap_walk_anon runs it: the VMAs with an anon_vma of the
/// live mms of its tree whose page offsets (`vm_pgoff` on) overlap the
/// folio's (`folio->index` on), in the tree's in-order (mm/interval_tree.c,
/// include/linux/interval_tree_generic.h): by the VMA's start pgoff, then
/// by when its avc was inserted (see `AnonVmas::avc_seq`). A VMA so found
/// need not map the folio (it may map other memory at those offsets):
/// every user checks the page-table entry, as page_vma_mapped_walk does.
pub fn anon_vma_interval_tree_foreach(m: &Machine, mms: &mut MmList, folio: Pfn) -> Vec<AvcVisit> {
    let ids = rmap_walk_anon(m, folio);
    let index = m.zone.memmap.folio_ext(folio).index;
    let last = index + (1u64 << m.zone.memmap.page(folio).order()) - 1;
    let mut visits = Vec::new();
    for mm in ids {
        let Some(mmp) = mms.get_mut(mm) else { continue };
        for vma in mmp.vmas.values().filter(|v| v.anon_vma) {
            if vma.pgoff > last || vma.pgoff + vma.pages() <= index {
                continue;
            }
            let offset = index.wrapping_sub(vma.pgoff) << PAGE_SHIFT;
            let addr = vma.start.wrapping_add(offset);
            visits.push((vma.pgoff, mm, vma.start, vma.end, addr));
        }
    }
    visits.sort_by_key(|&(pgoff, mm, start, ..)| (pgoff, m.anon_vmas.avc_seq(mm, start)));
    visits
        .into_iter()
        .map(|(_, mm, start, end, addr)| AvcVisit {
            mm,
            start,
            end,
            addr,
        })
        .collect()
}

/// try_to_migrate as unmap_folio runs it before a split
/// (TTU_SPLIT_HUGE_PMD), for what its removals do to the deferred split
/// queue. In the walk's order each mapping goes the way try_to_migrate_one
/// takes it: a PMD in one step (split_huge_pmd_locked with freeze:
/// folio_remove_rmap_pmd, and no PTE rmap added, as the PTEs become
/// migration entries), PTEs one page at a time (folio_remove_rmap_pte).
/// Each removal follows `__folio_remove_rmap` (CONFIG_PAGE_MAPCOUNT=y, the
/// kernel backend's config): a removal that unmaps pages while others stay
/// mapped and no PMD maps the folio any more makes it partially mapped,
/// and a folio not flagged so yet goes to deferred_split_folio(folio,
/// true), which counts thp_deferred_split_page and the size's
/// split_deferred. The split takes it off the queue again.
///
/// The model's split keeps the page tables and rewrites them afterwards
/// into what remap_page leaves (see `split_folio`), so the removals are
/// made on a copy of the folio's mapcounts, which the split discards.
pub fn try_to_migrate(m: &mut Machine, mms: &mut MmList, folio: Pfn) {
    let nr = 1usize << m.zone.memmap.page(folio).order();
    let mut entire = folio_entire_mapcount(m, folio);
    let mut mapped = folio_nr_pages_mapped(m, folio) as usize;
    let pages = m.zone.memmap.pages(folio, nr as u64);
    let mut mapcount: Vec<u16> = pages.iter().map(|p| p.mapcount).collect();
    for v in anon_vma_interval_tree_foreach(m, mms, folio) {
        let Some(mm) = mms.get_mut(v.mm) else {
            continue;
        };
        match mm.pmds.get(&(v.addr / PMD_SIZE)) {
            Some(Pmd::Huge { pfn, .. }) if *pfn == folio && v.holds_pmd() => {
                entire -= 1;
                let unmapped = if entire == 0 { nr - mapped } else { 0 };
                if unmapped > 0 && unmapped < nr {
                    remove_rmap_partially_mapped(m, folio);
                }
                continue;
            }
            _ => {}
        }
        // One table, unless the VMA's part of the folio crosses a PMD boundary.
        for (index, first, from, to) in v.pte_spans(nr) {
            let Some(Pmd::Table(t)) = mm.pmds.get(&index) else {
                continue;
            };
            for (i, count) in mapcount.iter_mut().enumerate().take(to).skip(from) {
                if t.ptes[first + i - from].pfn() != Some(Pfn(folio.0 + i as u64)) {
                    continue;
                }
                *count -= 1;
                if *count == 0 {
                    mapped -= 1;
                    if entire == 0 && mapped > 0 {
                        remove_rmap_partially_mapped(m, folio);
                    }
                }
            }
        }
    }
}

/// The end of `__folio_remove_rmap` for a removal that left the folio
/// partially mapped: queued unless flagged already.
fn remove_rmap_partially_mapped(m: &mut Machine, folio: Pfn) {
    if !m.zone.memmap.page(folio).test(pg::PARTIALLY_MAPPED) {
        deferred_split_folio(m, folio, true);
    }
}

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

/// `_pincount` of a large folio; small folios count pins in the refcount.
#[inline]
pub fn folio_pincount(m: &Machine, folio: Pfn) -> u32 {
    m.zone.memmap.page(Pfn(folio.0 + 3)).private
}

/// folio_mapcount: every page-table mapping of the folio (a PMD counts
/// once): `_large_mapcount` for a large folio, the page's for a small one.
#[inline]
pub fn folio_mapcount(m: &Machine, folio: Pfn) -> u64 {
    let head = m.zone.memmap.page(folio);
    if head.order() == 0 {
        u64::from(head.mapcount)
    } else {
        u64::from(m.zone.memmap.folio_ext(folio).large_mapcount)
    }
}

/// Adds `diff` (maybe negative) to `_large_mapcount`; the new value.
#[inline]
fn folio_mod_large_mapcount(m: &mut Machine, folio: Pfn, diff: i64) -> u64 {
    let ext = m.zone.memmap.folio_ext_mut(folio);
    let total = i64::from(ext.large_mapcount) + diff;
    debug_assert!(total >= 0, "_large_mapcount underflow on {folio}");
    ext.large_mapcount = total as u32;
    total as u64
}

/// folio_expected_ref_count == folio_ref_count for an anon folio: every
/// reference is explained by a mapping (no pin, no GUP in flight). Both
/// can_split_folio and khugepaged's is_refcount_suitable ask this.
///
/// Not named folio_expected_ref_count: it returns the comparison its callers make, not the count.
pub fn folio_refs_all_mappings(m: &Machine, folio: Pfn) -> bool {
    u64::from(folio_ref_count(m, folio)) == folio_mapcount(m, folio)
}

/// folio_maybe_dma_pinned.
pub fn folio_maybe_dma_pinned(m: &Machine, folio: Pfn) -> bool {
    if m.zone.memmap.page(folio).order() > 0 {
        folio_pincount(m, folio) > 0
    } else {
        folio_ref_count(m, folio) >= GUP_PIN_COUNTING_BIAS
    }
}

/// folio_maybe_mapped_shared: a small folio mapped more than once, or a large
/// one whose MM-ID slots say more than one MM maps it.
pub fn folio_maybe_mapped_shared(m: &Machine, folio: Pfn) -> bool {
    if m.zone.memmap.page(folio).order() == 0 {
        return m.zone.memmap.page(folio).mapcount > 1;
    }
    m.folio_mm_ids.get(&folio).is_some_and(|ids| ids.shared) && folio_mapcount(m, folio) > 1
}

/// folio_add_return_large_mapcount for `diff` mappings by `mm`, after which
/// the folio has `total`. `owner` is the MM that maps the folio now, for a
/// folio with no slots entry yet (the fork path: the parent).
fn folio_add_large_mapcount(m: &mut Machine, folio: Pfn, diff: u64, mm: MmId, owner: MmId) {
    let total = folio_mod_large_mapcount(m, folio, diff as i64);
    if m.folio_mm_ids.is_empty() && mm == owner {
        return;
    }
    let before = total - diff;
    let ids = m.folio_mm_ids.entry(folio).or_insert(FolioMmIds {
        mm_id: [owner, MM_ID_DUMMY],
        mapcount: [before, 0],
        shared: false,
    });
    if ids.mm_id[0] == mm {
        ids.mapcount[0] += diff;
    } else if ids.mm_id[1] == mm {
        ids.mapcount[1] += diff;
    } else if ids.mm_id[0] == MM_ID_DUMMY {
        ids.mm_id[0] = mm;
        ids.mapcount[0] = diff;
        // Other MMs may map it already.
        ids.shared |= total != diff;
    } else if ids.mm_id[1] == MM_ID_DUMMY {
        ids.mm_id[1] = mm;
        ids.mapcount[1] = diff;
        ids.shared = true;
    }
    let exclusive = !ids.shared && ids.mapcount.contains(&total);
    if exclusive && ids.mm_id.contains(&MM_ID_DUMMY) {
        m.folio_mm_ids.remove(&folio);
    }
}

/// folio_sub_return_large_mapcount for `diff` mappings by `mm`.
fn folio_sub_large_mapcount(m: &mut Machine, folio: Pfn, diff: u64, mm: MmId) {
    let total = folio_mod_large_mapcount(m, folio, -(diff as i64));
    if m.folio_mm_ids.is_empty() {
        return;
    }
    let Some(ids) = m.folio_mm_ids.get_mut(&folio) else {
        return;
    };
    let mut recheck = true;
    for slot in 0..2 {
        if ids.mm_id[slot] == mm {
            ids.mapcount[slot] = ids.mapcount[slot].saturating_sub(diff);
            if ids.mapcount[slot] > 0 {
                recheck = false;
            } else {
                ids.mm_id[slot] = MM_ID_DUMMY;
            }
            break;
        }
    }
    // One slot owning every mapping means mapped exclusively again.
    if recheck && ids.mapcount.contains(&total) {
        ids.shared = false;
    }
    let free_slot = ids.mm_id.contains(&MM_ID_DUMMY);
    if total == 0 || (!ids.shared && free_slot) {
        m.folio_mm_ids.remove(&folio);
    }
}

/// folio_add_new_anon_rmap(RMAP_EXCLUSIVE): a freshly allocated folio gets its
/// first mapping — by one PMD when `pmd`, else by one PTE per page — in
/// the mm `mm`, whose anon_vma it joins, its first page at page offset
/// `index` of its VMA (`linear_page_index`), which a large folio keeps as
/// `folio->index` (`__folio_set_anon`); an order-0 folio keeps no index in
/// the model and its callers pass 0.
#[inline]
pub fn folio_add_new_anon_rmap(
    m: &mut Machine,
    folio: Pfn,
    order: u32,
    pmd: bool,
    mm: MmId,
    index: u64,
) {
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
        pages[3].private = 0;
        pages[0].private = if pmd { 1 } else { nr as u32 };
        *m.zone.memmap.folio_ext_mut(folio) = crate::mm_types::FolioExt {
            anon_vma: mm,
            large_mapcount: if pmd { 1 } else { nr as u32 },
            index,
        };
        m.anon_vmas.get_folio(mm);
        m.stat.mod_mthp_stat(order, MthpStat::NrAnon, 1);
    } else {
        pages[0].private = 1;
    }
    m.stat.nr_anon_mapped += nr as i64;
    if pmd {
        m.stat.nr_anon_thps += nr as i64;
    }
}

/// folio_add_anon_rmap_ptes on an already mapped folio (the PMD split path):
/// `nr` pages from `page` gain a PTE mapping by `mm` and a reference each.
/// With `exclusive` (RMAP_EXCLUSIVE) they are marked PageAnonExclusive, else
/// the mark is cleared.
pub fn folio_add_anon_rmap_ptes(
    m: &mut Machine,
    folio: Pfn,
    page: Pfn,
    nr: u64,
    mm: MmId,
    exclusive: bool,
) {
    let memmap = &mut m.zone.memmap;
    let mut newly = 0;
    for p in memmap.pages_mut(page, nr) {
        p.mapcount += 1;
        newly += u32::from(p.mapcount == 1);
        if exclusive {
            p.set(pg::ANON_EXCLUSIVE);
        } else {
            p.clear(pg::ANON_EXCLUSIVE);
        }
    }
    memmap.page_mut(Pfn(folio.0 + 2)).private += newly;
    memmap.page_mut(folio).private += nr as u32;
    folio_add_large_mapcount(m, folio, nr, mm, mm);
    // Pages already mapped by a PMD were counted in NR_ANON_MAPPED then.
    if folio_entire_mapcount(m, folio) == 0 {
        m.stat.nr_anon_mapped += i64::from(newly);
    }
}

/// The folio may be pinned and a page to be shared is exclusive: fork must
/// copy instead (-EBUSY from folio_try_dup_anon_rmap_*).
#[derive(Debug)]
pub struct MaybePinned;

/// folio_try_dup_anon_rmap_ptes: fork shares `nr` PTE-mapped pages from
/// `page` with the child `dst`, clearing PageAnonExclusive; refused when the
/// folio may be pinned by `src` and one of the pages is exclusive.
#[inline]
pub fn folio_try_dup_anon_rmap_ptes(
    m: &mut Machine,
    folio: Pfn,
    page: Pfn,
    nr: u64,
    dst: MmId,
    src: MmId,
    maybe_pinned: bool,
) -> Result<(), MaybePinned> {
    let memmap = &mut m.zone.memmap;
    if nr == 1 && memmap.page(page).is_small_folio() {
        // A small folio: its page is the folio (the fork hot path).
        let p = memmap.page_mut(page);
        if maybe_pinned && p.test(pg::ANON_EXCLUSIVE) {
            return Err(MaybePinned);
        }
        p.clear(pg::ANON_EXCLUSIVE);
        p.mapcount += 1;
        p.private += 1;
        return Ok(());
    }
    let pages = memmap.pages_mut(page, nr);
    if maybe_pinned && pages.iter().any(|p| p.test(pg::ANON_EXCLUSIVE)) {
        return Err(MaybePinned);
    }
    for p in pages.iter_mut() {
        p.clear(pg::ANON_EXCLUSIVE);
        p.mapcount += 1;
    }
    let large = memmap.page(folio).order() > 0;
    if m.injected_bug == Some(crate::InjectedBug::DupRmapPtesSkipsMapcount) && large {
        m.zone.memmap.page_mut(page).mapcount -= 1;
    }
    m.zone.memmap.page_mut(folio).private += nr as u32;
    if large {
        folio_add_large_mapcount(m, folio, nr, dst, src);
    }
    Ok(())
}

/// folio_try_dup_anon_rmap_pmd: fork shares a PMD-mapped THP with `dst`.
pub fn folio_try_dup_anon_rmap_pmd(
    m: &mut Machine,
    folio: Pfn,
    dst: MmId,
    src: MmId,
    maybe_pinned: bool,
) -> Result<(), MaybePinned> {
    let head = m.zone.memmap.page_mut(folio);
    if head.test(pg::ANON_EXCLUSIVE) {
        if maybe_pinned {
            return Err(MaybePinned);
        }
        head.clear(pg::ANON_EXCLUSIVE);
    }
    head.private += 1;
    m.zone.memmap.page_mut(Pfn(folio.0 + 1)).private += 1;
    folio_add_large_mapcount(m, folio, 1, dst, src);
    Ok(())
}

/// folio_remove_rmap_pmd + the reference the PMD held. Returns true when the
/// folio's last reference went and it must be freed.
pub fn folio_remove_rmap_pmd(m: &mut Machine, folio: Pfn, mm: MmId) -> bool {
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
    folio_sub_large_mapcount(m, folio, 1, mm);
    folio_put_refs(m, folio, 1)
}

/// folio_remove_rmap_ptes + the references the PTEs held: `nr` consecutive
/// pages from `page` lose one PTE mapping by `mm` each. Queues the folio for
/// deferred split when it is left partially mapped. Returns true when the
/// folio must be freed.
#[inline]
pub fn folio_remove_rmap_ptes(m: &mut Machine, folio: Pfn, page: Pfn, nr: u64, mm: MmId) -> bool {
    let memmap = &mut m.zone.memmap;
    if nr == 1 && memmap.page(page).is_small_folio() {
        // A small folio: one page holds it all.
        let p = memmap.page_mut(page);
        debug_assert!(
            p.mapcount > 0 && p.private > 0,
            "PTE unmap of an unmapped page"
        );
        p.mapcount -= 1;
        p.private -= 1;
        m.stat.nr_anon_mapped -= i64::from(p.mapcount == 0);
        return p.private == 0;
    }
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
        folio_sub_large_mapcount(m, folio, nr, mm);
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

#[cfg(test)]
mod tests {
    use super::AnonVmas;

    #[test]
    fn avc_order_is_fork_order_until_a_split_reinserts() {
        let mut avs = AnonVmas::default();
        avs.alloc(1);
        avs.fork(1, 2);
        avs.fork(1, 3);
        let start = 0x4000_0000;
        // The faulting mm's VMA first, then the children as they forked.
        assert!(avs.avc_seq(1, start) < avs.avc_seq(2, start));
        assert!(avs.avc_seq(2, start) < avs.avc_seq(3, start));
        // A split of the parent's VMA re-inserts it after both children.
        avs.avc_reinsert(1, start);
        assert!(avs.avc_seq(1, start) > avs.avc_seq(3, start));
        // Unlinked (munmap): a VMA mapped there later ranks as prepared.
        avs.avc_unlink(1, start);
        assert_eq!(avs.avc_seq(1, start), 0);
    }

    /// split_deferred of an under-used THP shared by a and its child b,
    /// after `layout` (statements of a and b), at reclaim.
    fn split_deferred_after(layout: &str) -> i64 {
        let text = crate::one_thp_at_409(&format!("a write buf:4K\na fork b\n{layout}\nreclaim\n"));
        let end = crate::end_counters(&text);
        assert_eq!(end["vmstat.thp_underused_split_page"], 1);
        end["mthp.2048kB.split_deferred"]
    }

    #[test]
    fn the_walk_order_decides_whether_a_shared_split_counts_split_deferred() {
        // a's PMD first, then b's PTEs: partially mapped on the way.
        assert_eq!(split_deferred_after("b write buf+1M:4K"), 1);
        assert_eq!(split_deferred_after("b mprotect buf:1M r"), 1);
        // a's PTEs first while b's PMD maps everything: never partially.
        assert_eq!(split_deferred_after("a write buf+1M:4K"), 0);
        // a's mprotect re-inserts a's VMAs after b's: b's PMD first.
        assert_eq!(split_deferred_after("a mprotect buf:1M r"), 1);
        // Both PTE-mapped: b's first removal unmaps a page.
        let both = "a mprotect buf:1M r\nb mprotect buf:1M r";
        assert_eq!(split_deferred_after(both), 1);
    }
}
