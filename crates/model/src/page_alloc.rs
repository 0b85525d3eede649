//! The buddy allocator: one zone of physical memory, free lists per order;
//! and folios allocated from it and freed to it (`alloc_folio`, `free_folio`).
//!
//! Follows Linux 6.18 `mm/page_alloc.c`: `__rmqueue_smallest` takes the smallest
//! free block of at least the requested order and `expand`s it, returning the
//! upper halves to the free lists; `__free_one_page` merges a freed block with
//! its buddy while the buddy is free and of the same order.
//!
//! Deliberate simplifications:
//! - one node, one zone (ZONE_NORMAL), no migratetypes, no per-cpu page lists
//!   (frees merge at once), no watermarks or lowmem reserves: an allocation fails
//!   only when no free block of a sufficient order exists;
//! - no direct compaction or reclaim yet, whatever `defrag` says: a large-folio
//!   allocation fails as soon as memory is too fragmented for it;
//! - memory never touched is not on any free list: it sits above `frontier` as
//!   MAX_PAGE_ORDER blocks and is carved off when the free lists run dry, so the
//!   model of a 1 TiB machine costs nothing before it is used (the kernel's
//!   deferred struct page init does the same with its memmap);
//! - free lists are LIFO stacks (the kernel adds freed pages at the head and
//!   allocates from the head). Taking a block out of the middle of its list
//!   (a merge with a freed buddy, `del_page_from_free_list`) moves the top
//!   block into its slot: each free block's head page records its slot (the
//!   kernel links `page->buddy_list` instead), so a free and every merge it
//!   makes cost O(1) and the lists never hold stale entries.

use crate::gfp::Gfp;
use crate::huge_memory::folio_unqueue_deferred_split;
use crate::mm_types::{pg, Pfn, MAX_PAGE_ORDER, NR_PAGE_ORDERS};
use crate::sparse::MemMap;
use crate::trace::Step;
use crate::vmstat::MthpStat;
use crate::Machine;

#[derive(Default)]
struct FreeArea {
    /// The free blocks' head pfns; the last is the list's head (allocated
    /// first). Each head page's `private` holds its slot here.
    list: Vec<u32>,
}

impl FreeArea {
    fn nr_free(&self) -> u64 {
        self.list.len() as u64
    }
}

pub struct Zone {
    pub memmap: MemMap,
    free_area: [FreeArea; NR_PAGE_ORDERS],
    /// Frames at or above this have never been allocated (and are not on any list).
    frontier: u64,
    /// zone->spanned_pages: frames in the zone.
    spanned: u64,
    /// Frames currently free, on lists or above the frontier.
    nr_free_pages: u64,
}

impl Zone {
    /// A zone of `nr_pages` frames, all free.
    pub fn new(nr_pages: u64) -> Self {
        Zone {
            memmap: MemMap::new(nr_pages),
            free_area: Default::default(),
            frontier: 0,
            spanned: nr_pages,
            nr_free_pages: nr_pages,
        }
    }

    pub fn spanned_pages(&self) -> u64 {
        self.spanned
    }

    pub fn nr_free_pages(&self) -> u64 {
        self.nr_free_pages
    }

    /// nr_free of each order's free list (what /proc/buddyinfo prints), counting
    /// never-touched memory as free MAX_PAGE_ORDER blocks.
    pub fn buddyinfo(&self) -> [u64; NR_PAGE_ORDERS] {
        let mut info = [0; NR_PAGE_ORDERS];
        for (o, area) in self.free_area.iter().enumerate() {
            info[o] = area.nr_free();
        }
        let mut pfn = self.frontier;
        while pfn < self.spanned {
            let order = self.frontier_block_order(pfn);
            info[order as usize] += 1;
            pfn += 1 << order;
        }
        info
    }

    /// Allocates a naturally aligned block of 2^order frames, or None when no
    /// free block of that order or larger exists. Page metadata of the block is
    /// left cleared: the caller initialises what it uses.
    pub fn alloc_pages(&mut self, order: u32) -> Option<Pfn> {
        debug_assert!(order <= MAX_PAGE_ORDER);
        let (pfn, found) = self
            .rmqueue_smallest(order)
            .or_else(|| self.carve_frontier(order))?;
        self.expand(pfn, order, found);
        let page = self.memmap.page_mut(Pfn(pfn));
        page.init(0, 0);
        self.nr_free_pages -= 1 << order;
        Some(Pfn(pfn))
    }

    /// alloc_contig_pages for a gigantic page: the first naturally aligned
    /// range of 2^order frames (order above MAX_PAGE_ORDER) that is wholly
    /// free, taken off the free lists. The kernel scans the zone the same
    /// way but also migrates movable pages out of a candidate range
    /// (`alloc_contig_range`); the model takes only free ranges, so on a
    /// fragmented machine it finds fewer gigantic pages than the kernel.
    pub fn alloc_contig_pages(&mut self, order: u32) -> Option<Pfn> {
        debug_assert!(order > MAX_PAGE_ORDER);
        let nr = 1u64 << order;
        let mut pfn = 0;
        while pfn + nr <= self.spanned {
            if self.range_free(pfn, nr) {
                while self.frontier < pfn + nr {
                    let block = self.frontier_block_order(self.frontier);
                    let head = self.frontier;
                    self.memmap.online_section(Pfn(head));
                    self.frontier += 1 << block;
                    self.add_to_free_list(head, block);
                }
                let mut p = pfn;
                while p < pfn + nr {
                    let order = self.memmap.page(Pfn(p)).order();
                    self.del_page_from_free_list(p, order);
                    p += 1 << order;
                }
                self.nr_free_pages -= nr;
                return Some(Pfn(pfn));
            }
            pfn += nr;
        }
        None
    }

    /// Whether every frame of `[pfn, pfn + nr)` is free (free blocks never
    /// straddle a range aligned to more than MAX_PAGE_ORDER).
    fn range_free(&self, pfn: u64, nr: u64) -> bool {
        let mut p = pfn;
        while p < pfn + nr {
            if p >= self.frontier {
                return true;
            }
            let page = self.memmap.page(Pfn(p));
            if !page.test(pg::BUDDY) {
                return false;
            }
            p += 1 << page.order();
        }
        true
    }

    /// Returns a block to the free lists, merging it with free buddies.
    pub fn free_pages(&mut self, pfn: Pfn, order: u32) {
        debug_assert_eq!(pfn.0 & ((1 << order) - 1), 0, "unaligned free of {pfn}");
        self.nr_free_pages += 1 << order;
        let mut pfn = pfn.0;
        let mut order = order;
        while order < MAX_PAGE_ORDER {
            let buddy = pfn ^ (1 << order);
            if buddy >= self.frontier || !self.is_free_block(buddy, order) {
                break;
            }
            self.del_page_from_free_list(buddy, order);
            pfn &= !(1 << order);
            order += 1;
        }
        self.add_to_free_list(pfn, order);
    }

    /// Frees the `nr` order-0 pages from `pfn` on, in ascending order: the
    /// same free lists as `nr` calls of `free_pages(page, 0)`, for less.
    /// Within a naturally aligned block that the run covers, each page's
    /// merge partner is the block just made from the pages before it, which
    /// is always the top of its list, so page by page the block's pages come
    /// and go and leave only the whole block, merged onwards as
    /// `free_pages(block, order)` merges it.
    pub fn free_pages_run(&mut self, pfn: Pfn, nr: u64) {
        let (mut pfn, end) = (pfn.0, pfn.0 + nr);
        while pfn < end {
            let mut order = pfn.trailing_zeros().min(MAX_PAGE_ORDER);
            while pfn + (1 << order) > end {
                order -= 1;
            }
            self.free_pages(Pfn(pfn), order);
            pfn += 1 << order;
        }
    }

    fn is_free_block(&self, pfn: u64, order: u32) -> bool {
        let page = self.memmap.page(Pfn(pfn));
        page.test(pg::BUDDY) && page.order() == order
    }

    fn add_to_free_list(&mut self, pfn: u64, order: u32) {
        let area = &mut self.free_area[order as usize];
        let page = self.memmap.page_mut(Pfn(pfn));
        page.init(pg::BUDDY, order);
        page.private = area.list.len() as u32;
        area.list.push(pfn as u32);
    }

    /// del_page_from_free_list: the block leaves its list from wherever it
    /// is; the list's top block takes its slot.
    fn del_page_from_free_list(&mut self, pfn: u64, order: u32) {
        let area = &mut self.free_area[order as usize];
        let slot = self.memmap.page(Pfn(pfn)).private as usize;
        debug_assert_eq!(area.list[slot] as u64, pfn);
        area.list.swap_remove(slot);
        if let Some(&moved) = area.list.get(slot) {
            self.memmap.page_mut(Pfn(u64::from(moved))).private = slot as u32;
        }
        self.memmap.page_mut(Pfn(pfn)).init(0, 0);
    }

    /// __rmqueue_smallest: takes the head block of the first non-empty list
    /// of order >= `order`.
    fn rmqueue_smallest(&mut self, order: u32) -> Option<(u64, u32)> {
        for o in order..=MAX_PAGE_ORDER {
            if let Some(pfn) = self.free_area[o as usize].list.pop() {
                let pfn = u64::from(pfn);
                self.memmap.page_mut(Pfn(pfn)).init(0, 0);
                return Some((pfn, o));
            }
        }
        None
    }

    /// The order of the never-used block starting at `pfn`: MAX_PAGE_ORDER, or
    /// smaller at the end of a zone whose size is not a multiple of 4 MiB.
    fn frontier_block_order(&self, pfn: u64) -> u32 {
        let mut order = MAX_PAGE_ORDER;
        while pfn & ((1 << order) - 1) != 0 || pfn + (1 << order) > self.spanned {
            order -= 1;
        }
        order
    }

    /// Takes the next never-used block, if it is large enough.
    fn carve_frontier(&mut self, order: u32) -> Option<(u64, u32)> {
        while self.frontier < self.spanned {
            let pfn = self.frontier;
            let block = self.frontier_block_order(pfn);
            self.memmap.online_section(Pfn(pfn));
            self.frontier += 1 << block;
            if block >= order {
                return Some((pfn, block));
            }
            // A small block at the end of the zone: free it like any other.
            self.nr_free_pages -= 1 << block;
            self.free_pages(Pfn(pfn), block);
            if let Some(found) = self.rmqueue_smallest(order) {
                return Some(found);
            }
        }
        None
    }

    /// expand: splits a block of order `high` down to `low`, freeing upper halves.
    fn expand(&mut self, pfn: u64, low: u32, mut high: u32) {
        while high > low {
            high -= 1;
            self.add_to_free_list(pfn + (1 << high), high);
        }
    }

    /// Host bytes used by the model of this zone.
    pub fn footprint_bytes(&self) -> u64 {
        let lists: usize = self.free_area.iter().map(|a| a.list.capacity() * 4).sum();
        self.memmap.footprint_bytes() + lists as u64
    }
}

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
/// fast path, and what `gfp` allows when it finds no free block. Records
/// the attempt for `hugelab explain`.
pub fn vma_alloc_folio(m: &mut Machine, gfp: Gfp, order: u32) -> Option<Pfn> {
    let folio = alloc_folio(m, order);
    m.trace(|| Step::Alloc {
        order,
        gfp,
        ok: folio.is_some(),
    });
    folio
}

/// The end of folio_put for a folio whose last reference went: `__folio_put`
/// (mm/swap.c) takes it off the deferred split queue, `free_pages_prepare`
/// drops the size's nr_anon, and the buddy allocator takes the pages back.
/// The model keeps a large folio's MM-ID slots beside the memmap: they go
/// too, and its anon_vma loses the folio's reference.
pub fn free_folio(m: &mut Machine, folio: Pfn) {
    let head = *m.zone.memmap.page(folio);
    let order = head.order();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_and_merge_back_to_one_block() {
        let mut zone = Zone::new(1024);
        let a = zone.alloc_pages(0).expect("order-0");
        let b = zone.alloc_pages(3).expect("order-3");
        assert_eq!(zone.nr_free_pages(), 1024 - 1 - 8);
        assert_eq!(b.0 % 8, 0);
        zone.free_pages(a, 0);
        zone.free_pages(b, 3);
        assert_eq!(zone.nr_free_pages(), 1024);
        assert_eq!(zone.buddyinfo()[MAX_PAGE_ORDER as usize], 1);
        assert_eq!(zone.buddyinfo().iter().sum::<u64>(), 1);
    }

    #[test]
    fn fragmentation_fails_large_orders_but_not_small() {
        let mut zone = Zone::new(1024);
        let pages: Vec<Pfn> = (0..1024)
            .map(|_| zone.alloc_pages(0).expect("fits"))
            .collect();
        assert!(zone.alloc_pages(0).is_none());
        // Free every other frame: 512 free frames, no two of them buddies.
        for p in pages.iter().filter(|p| p.0 % 2 == 0) {
            zone.free_pages(*p, 0);
        }
        assert_eq!(zone.nr_free_pages(), 512);
        assert!(zone.alloc_pages(1).is_none());
        assert!(zone.alloc_pages(0).is_some());
    }

    #[test]
    fn odd_sized_zone_uses_every_frame() {
        let mut zone = Zone::new(1024 + 512 + 3);
        let mut n = 0;
        while zone.alloc_pages(0).is_some() {
            n += 1;
        }
        assert_eq!(n, 1024 + 512 + 3);
    }

    /// The free lists and page metadata, for comparing two zones.
    fn state(zone: &Zone) -> (Vec<Vec<u32>>, Vec<crate::mm_types::Page>) {
        let lists = zone.free_area.iter().map(|a| a.list.clone()).collect();
        let pages = (0..zone.spanned)
            .map(|p| *zone.memmap.page(Pfn(p)))
            .collect();
        (lists, pages)
    }

    #[test]
    fn a_run_frees_like_its_pages_one_by_one() {
        // Scattered frees first (list entries out of order), then runs of
        // every alignment and length; both zones must end identical.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for case in 0..200 {
            let mut a = Zone::new(4096);
            let pages: Vec<Pfn> = (0..4096).map(|_| a.alloc_pages(0).unwrap()).collect();
            let mut b = Zone::new(4096);
            for _ in 0..4096 {
                b.alloc_pages(0).unwrap();
            }
            let mut freed = vec![false; 4096];
            for _ in 0..case * 5 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let p = (seed % 4096) as usize;
                if !freed[p] {
                    freed[p] = true;
                    a.free_pages(pages[p], 0);
                    b.free_pages(pages[p], 0);
                }
            }
            let mut p = (seed % 97) as usize;
            while p < 4096 {
                let len = 1 + (seed as usize >> (p % 13)) % 300;
                let run: Vec<usize> = (p..(p + len).min(4096))
                    .take_while(|&q| !freed[q])
                    .collect();
                if let Some(&first) = run.first() {
                    for &q in &run {
                        freed[q] = true;
                        a.free_pages(pages[q], 0);
                    }
                    b.free_pages_run(pages[first], run.len() as u64);
                }
                p += len + 1 + (seed as usize % 7);
            }
            assert_eq!(a.nr_free_pages(), b.nr_free_pages(), "case {case}");
            assert!(state(&a) == state(&b), "case {case}: the zones differ");
        }
    }

    #[test]
    fn a_gigantic_range_is_the_first_wholly_free_one() {
        // Three 1G ranges (order 18); one small page in use in the first.
        let mut zone = Zone::new(3 << 18);
        let small = zone.alloc_pages(0).expect("a page");
        assert!(small.0 < 1 << 18);
        let first = zone.alloc_contig_pages(18).expect("the second range");
        assert_eq!(first.0, 1 << 18);
        assert_eq!(zone.nr_free_pages(), (2 << 18) - 1);
        let second = zone.alloc_contig_pages(18).expect("the third");
        assert_eq!(second.0, 2 << 18);
        assert!(
            zone.alloc_contig_pages(18).is_none(),
            "the first range is not wholly free"
        );
        zone.free_pages(small, 0);
        assert_eq!(zone.alloc_contig_pages(18), Some(Pfn(0)));
        zone.free_pages_run(first, 1 << 18);
        assert_eq!(zone.nr_free_pages(), 1 << 18);
        assert_eq!(zone.buddyinfo()[MAX_PAGE_ORDER as usize], 256);
    }

    #[test]
    fn terabyte_zone_is_cheap_until_used() {
        let zone = Zone::new((1u64 << 40) >> 12);
        assert!(zone.footprint_bytes() < 1 << 20);
    }
}
