//! The zone and its buddy free lists: `struct zone` with its free areas per
//! order and migratetype, its pageblocks' types and its compaction state,
//! and the free-list operations that allocate and free blocks of it.
//!
//! Follows Linux 6.18 `include/linux/mmzone.h` (`struct zone`,
//! `struct free_area`, `enum migratetype`, `PAGE_ALLOC_COSTLY_ORDER`),
//! `include/linux/pageblock-flags.h` (`pageblock_order`) and the buddy half of
//! `mm/page_alloc.c`:
//! - `__rmqueue`: `__rmqueue_smallest` takes the smallest free block of at
//!   least the requested order from the free lists of the allocation's
//!   migratetype and `expand`s it, returning the upper halves to the lists
//!   of the block's pageblock type; failing that, `__rmqueue_claim` takes the
//!   largest block of the other type whose pageblock it can claim
//!   (`should_try_claim_block`, `try_to_claim_block`: a block of a pageblock
//!   or more always, a smaller one when the pageblock's free and compatible
//!   pages are at least half of it), first whole pageblocks only
//!   (ALLOC_NOFRAGMENT, which a ZONE_NORMAL allocation with a lower zone
//!   starts with), then any; failing that `__rmqueue_steal` takes the
//!   smallest block of the other type, leaving its pageblock's type;
//! - `__free_one_page` merges a freed block with its buddy while the buddy is
//!   free and of the same order (merged pageblocks take the freed block's
//!   type);
//! - what compaction takes from the free lists (`__isolate_free_page`,
//!   `take_page_off_buddy`, declared in mm/internal.h).
//!
//! A module of its own below `compaction`, which works on these lists, while
//! the allocation path that calls compaction (`__alloc_pages_slowpath`) is
//! `page_alloc`, above it. The simplifications that concern the free lists
//! (one zone, two migratetypes, the never-used frontier, LIFO lists) are
//! described in `page_alloc`.

use crate::mm_types::{pg, Pfn, HPAGE_PMD_ORDER, MAX_PAGE_ORDER, NR_PAGE_ORDERS};
use crate::sparse::MemMap;

/// The migratetypes the model distinguishes (enum migratetype).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrateType {
    /// MIGRATE_UNMOVABLE: page tables, kernel pages.
    Unmovable = 0,
    /// MIGRATE_MOVABLE: user pages.
    Movable = 1,
}

const NR_MIGRATETYPES: usize = 2;

impl MigrateType {
    /// fallbacks[]: the other type.
    fn other(self) -> MigrateType {
        match self {
            MigrateType::Unmovable => MigrateType::Movable,
            MigrateType::Movable => MigrateType::Unmovable,
        }
    }
}

/// should_try_claim_block: unmovable allocations always try to claim the
/// pageblock they fall back into; movable ones only from half a pageblock up.
fn should_try_claim_block(order: u32, mt: MigrateType) -> bool {
    order >= PAGEBLOCK_ORDER || order >= PAGEBLOCK_ORDER / 2 || mt == MigrateType::Unmovable
}

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
    /// The compaction state of the zone (deferral; see `compaction`).
    pub compact: ZoneCompact,
    /// Pageblocks (order 9) marked MIGRATE_UNMOVABLE, by pageblock index;
    /// every other pageblock is MIGRATE_MOVABLE. Grown only when a block is
    /// marked, so a zone with no unmovable allocation costs nothing here.
    unmovable_blocks: Vec<bool>,
    /// free_area[order].free_list[migratetype].
    free_area: [[FreeArea; NR_MIGRATETYPES]; NR_PAGE_ORDERS],
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
            compact: Default::default(),
            unmovable_blocks: Vec::new(),
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
            info[o] = area.iter().map(FreeArea::nr_free).sum();
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
        self.alloc_pages_mt(order, MigrateType::Movable)
    }

    /// alloc_pages for an allocation of migratetype `mt` (`__rmqueue`): its
    /// own free lists first, then claiming a block of the other type, at
    /// first only whole pageblocks (ALLOC_NOFRAGMENT, which a ZONE_NORMAL
    /// allocation starts with), then any claimable one, then stealing the
    /// smallest block of the other type without claiming its pageblock.
    ///
    /// Not named __rmqueue: it also takes the zone's free-page accounting that __rmqueue's callers do, with no per-cpu lists in between.
    pub fn alloc_pages_mt(&mut self, order: u32, mt: MigrateType) -> Option<Pfn> {
        debug_assert!(order <= MAX_PAGE_ORDER);
        let pfn = match self.rmqueue_smallest(order, mt) {
            Some(pfn) => pfn,
            None => self
                .rmqueue_claim(order, mt, true)
                .or_else(|| self.rmqueue_claim(order, mt, false))
                .or_else(|| self.rmqueue_steal(order, mt))?,
        };
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
            // Pageblocks that merge take the freed block's type.
            let mt = self.block_mt(pfn);
            if order >= PAGEBLOCK_ORDER && self.block_mt(buddy) != mt {
                self.set_block_mt(buddy, mt);
            }
            pfn &= !(1 << order);
            order += 1;
        }
        self.add_to_free_list(pfn, order);
    }

    /// get_pageblock_migratetype == MIGRATE_MOVABLE.
    pub fn pageblock_movable(&self, pfn: Pfn) -> bool {
        !self
            .unmovable_blocks
            .get((pfn.0 >> PAGEBLOCK_ORDER) as usize)
            .copied()
            .unwrap_or(false)
    }

    /// The pageblock of `pfn` becomes MIGRATE_UNMOVABLE, its free blocks
    /// moving to the unmovable lists (an unmovable allocation claimed it).
    ///
    /// Named for set_pageblock_migratetype(MIGRATE_UNMOVABLE) with move_freepages_block, which the kernel calls apart.
    pub fn set_pageblock_unmovable(&mut self, pfn: Pfn) {
        if self.pageblock_movable(pfn) {
            self.move_freepages_block(
                pfn.0 & !((1 << PAGEBLOCK_ORDER) - 1),
                MigrateType::Unmovable,
            );
        }
    }

    /// A free block of `order` or more that a movable allocation can take
    /// without stealing: on a movable list, or on an unmovable one at an
    /// order whose pageblock it could claim (`__compact_finished`,
    /// `find_suitable_fallback`).
    pub fn has_movable_free_block(&self, order: u32) -> bool {
        (order..=MAX_PAGE_ORDER).any(|o| {
            !self.free_area[o as usize][MigrateType::Movable as usize]
                .list
                .is_empty()
                || (should_try_claim_block(o, MigrateType::Movable)
                    && !self.free_area[o as usize][MigrateType::Unmovable as usize]
                        .list
                        .is_empty())
        }) || (self.frontier < self.spanned && self.frontier_block_order(self.frontier) >= order)
    }

    /// Whether a free block of `order` or larger exists (zone_watermark_ok
    /// for `order` with the model's zero watermarks).
    pub fn has_free_block(&self, order: u32) -> bool {
        (order..=MAX_PAGE_ORDER).any(|o| self.free_area[o as usize].iter().any(|a| a.nr_free() > 0))
            || (self.frontier < self.spanned && self.frontier_block_order(self.frontier) >= order)
    }

    /// Puts every never-used block on the free lists, so that a pfn walk
    /// (compaction's scanners, the fragmentation generator) finds memory
    /// as the kernel's memmap has it.
    pub(crate) fn materialise_frontier(&mut self) {
        while self.frontier < self.spanned {
            let block = self.frontier_block_order(self.frontier);
            let head = self.frontier;
            self.memmap.online_section(Pfn(head));
            self.frontier += 1 << block;
            self.add_to_free_list(head, block);
        }
    }

    /// __isolate_free_page: takes the free block headed at `pfn` off its
    /// list (compaction's free scanner). The frontier must be materialised.
    pub(crate) fn __isolate_free_page(&mut self, pfn: Pfn, order: u32) {
        debug_assert!(self.is_free_block(pfn.0, order));
        self.del_page_from_free_list(pfn.0, order);
        self.nr_free_pages -= 1 << order;
    }

    /// take_page_off_buddy (mm/page_alloc.c): takes the one free frame `pfn`
    /// (splitting the free block around it and giving the rest back, as
    /// break_down_buddy_pages does), or returns false when it is in use. The
    /// frontier must be materialised. The page is left cleared.
    pub(crate) fn take_page_off_buddy(&mut self, pfn: Pfn) -> bool {
        let Some(order) =
            (0..=MAX_PAGE_ORDER).find(|&o| self.is_free_block(pfn.0 & !((1 << o) - 1), o))
        else {
            return false;
        };
        let mut head = pfn.0 & !((1 << order) - 1);
        self.del_page_from_free_list(head, order);
        let mut o = order;
        while o > 0 {
            o -= 1;
            let half = 1u64 << o;
            if pfn.0 < head + half {
                self.add_to_free_list(head + half, o);
            } else {
                self.add_to_free_list(head, o);
                head += half;
            }
        }
        self.memmap.page_mut(pfn).init(0, 0);
        self.nr_free_pages -= 1;
        true
    }

    /// Frees the `nr` order-0 pages from `pfn` on, in ascending order: the
    /// same free lists as `nr` calls of `free_pages(page, 0)`, for less.
    /// Within a naturally aligned block that the run covers, each page's
    /// merge partner is the block just made from the pages before it, which
    /// is always the top of its list, so page by page the block's pages come
    /// and go and leave only the whole block, merged onwards as
    /// `free_pages(block, order)` merges it.
    ///
    /// No kernel function: a run of free_pages(order 0) calls done in one pass, for speed; the kernel frees them one by one.
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
        if pfn >= self.frontier {
            return false;
        }
        let page = self.memmap.page(Pfn(pfn));
        page.test(pg::BUDDY) && page.order() == order
    }

    /// The migratetype of the pageblock holding `pfn`.
    fn block_mt(&self, pfn: u64) -> MigrateType {
        if self.pageblock_movable(Pfn(pfn)) {
            MigrateType::Movable
        } else {
            MigrateType::Unmovable
        }
    }

    /// set_pageblock_migratetype, without moving free blocks.
    fn set_block_mt(&mut self, pfn: u64, mt: MigrateType) {
        let block = (pfn >> PAGEBLOCK_ORDER) as usize;
        if mt == MigrateType::Unmovable && self.unmovable_blocks.len() <= block {
            self.unmovable_blocks.resize(block + 1, false);
        }
        if let Some(b) = self.unmovable_blocks.get_mut(block) {
            *b = mt == MigrateType::Unmovable;
        }
    }

    /// __add_to_free_list at the head: the free list of the block's
    /// pageblock type.
    fn add_to_free_list(&mut self, pfn: u64, order: u32) {
        let mt = self.block_mt(pfn) as usize;
        let area = &mut self.free_area[order as usize][mt];
        let page = self.memmap.page_mut(Pfn(pfn));
        page.init(pg::BUDDY, order);
        page.private = area.list.len() as u32;
        area.list.push(pfn as u32);
    }

    /// __add_to_free_list at the tail (move_to_free_list) for blocks of one
    /// order, in order: allocated after every block already listed. The
    /// list's slots are renumbered once.
    ///
    /// Named for __add_to_free_list(.., tail = true), for a run of blocks.
    fn add_to_free_list_tail(&mut self, blocks: &[u64], order: u32) {
        let Some(&first) = blocks.first() else {
            return;
        };
        let mt = self.block_mt(first) as usize;
        for &pfn in blocks {
            self.memmap.page_mut(Pfn(pfn)).init(pg::BUDDY, order);
        }
        let list = &mut self.free_area[order as usize][mt].list;
        // The list's tail is its start (blocks are taken from the end).
        list.splice(0..0, blocks.iter().rev().map(|&p| p as u32));
        let list = std::mem::take(list);
        for (slot, &p) in list.iter().enumerate() {
            self.memmap.page_mut(Pfn(u64::from(p))).private = slot as u32;
        }
        self.free_area[order as usize][mt].list = list;
    }

    /// del_page_from_free_list: the block leaves its list from wherever it
    /// is; the list's top block takes its slot.
    fn del_page_from_free_list(&mut self, pfn: u64, order: u32) {
        let mt = self.block_mt(pfn) as usize;
        let area = &mut self.free_area[order as usize][mt];
        let slot = self.memmap.page(Pfn(pfn)).private as usize;
        debug_assert_eq!(area.list[slot] as u64, pfn);
        area.list.swap_remove(slot);
        if let Some(&moved) = area.list.get(slot) {
            self.memmap.page_mut(Pfn(u64::from(moved))).private = slot as u32;
        }
        self.memmap.page_mut(Pfn(pfn)).init(0, 0);
    }

    /// __rmqueue_smallest: takes the head block of the first non-empty list
    /// of `mt` of order >= `order` (never-used memory last, as MOVABLE
    /// blocks at the lists' tails) and expands it.
    fn rmqueue_smallest(&mut self, order: u32, mt: MigrateType) -> Option<u64> {
        for o in order..=MAX_PAGE_ORDER {
            if let Some(&pfn) = self.free_area[o as usize][mt as usize].list.last() {
                let pfn = u64::from(pfn);
                self.del_page_from_free_list(pfn, o);
                self.expand(pfn, order, o);
                return Some(pfn);
            }
        }
        if mt == MigrateType::Movable {
            let (pfn, found) = self.carve_frontier(order)?;
            self.expand(pfn, order, found);
            return Some(pfn);
        }
        None
    }

    /// The head block of the free list of `mt` at `order`, putting the next
    /// never-used block there first when the list is empty and the block
    /// has that order (never-used memory is MOVABLE).
    fn free_area_head(&mut self, order: u32, mt: MigrateType) -> Option<u64> {
        if self.free_area[order as usize][mt as usize].list.is_empty()
            && mt == MigrateType::Movable
            && self.frontier < self.spanned
            && self.frontier_block_order(self.frontier) == order
        {
            let head = self.frontier;
            self.memmap.online_section(Pfn(head));
            self.frontier += 1 << order;
            self.add_to_free_list(head, order);
        }
        self.free_area[order as usize][mt as usize]
            .list
            .last()
            .map(|&p| u64::from(p))
    }

    /// __rmqueue_claim: the largest free block of the other type, from
    /// MAX_PAGE_ORDER down, whose pageblock `mt` can claim
    /// (try_to_claim_block); with `nofragment` only whole pageblocks.
    fn rmqueue_claim(&mut self, order: u32, mt: MigrateType, nofragment: bool) -> Option<u64> {
        let min_order = if order < PAGEBLOCK_ORDER && nofragment {
            PAGEBLOCK_ORDER
        } else {
            order
        };
        let other = mt.other();
        for cur in (min_order..=MAX_PAGE_ORDER).rev() {
            if !should_try_claim_block(cur, mt) {
                break;
            }
            let Some(pfn) = self.free_area_head(cur, other) else {
                continue;
            };
            if let Some(page) = self.try_to_claim_block(pfn, cur, order, mt, other) {
                return Some(page);
            }
        }
        None
    }

    /// try_to_claim_block: a free block of a pageblock or more changes type
    /// with its pageblocks; a smaller one's pageblock is claimed when its
    /// free and compatible pages are at least half of it.
    fn try_to_claim_block(
        &mut self,
        pfn: u64,
        cur: u32,
        order: u32,
        mt: MigrateType,
        block_type: MigrateType,
    ) -> Option<u64> {
        if cur >= PAGEBLOCK_ORDER {
            self.del_page_from_free_list(pfn, cur);
            for block in 0..1u64 << (cur - PAGEBLOCK_ORDER) {
                self.set_block_mt(pfn + (block << PAGEBLOCK_ORDER), mt);
            }
            self.expand(pfn, order, cur);
            return Some(pfn);
        }
        let start = pfn & !((1 << PAGEBLOCK_ORDER) - 1);
        let (free, movable) = self.count_block_pages(start);
        let alike = match (mt, block_type) {
            (MigrateType::Movable, _) => movable,
            (MigrateType::Unmovable, MigrateType::Movable) => {
                (1 << PAGEBLOCK_ORDER) - (free + movable)
            }
            _ => 0,
        };
        if free + alike >= 1 << (PAGEBLOCK_ORDER - 1) {
            self.move_freepages_block(start, mt);
            return self.rmqueue_smallest(order, mt);
        }
        None
    }

    /// prep_move_freepages_block: free pages and movable (anonymous user)
    /// pages of the pageblock at `start`.
    fn count_block_pages(&self, start: u64) -> (u64, u64) {
        let (mut free, mut movable) = (0, 0);
        let mut pfn = start;
        let end = (start + (1 << PAGEBLOCK_ORDER)).min(self.spanned);
        while pfn < end {
            if pfn >= self.frontier {
                free += end - pfn;
                break;
            }
            let page = self.memmap.page(Pfn(pfn));
            let step = if page.test(pg::BUDDY) {
                free += 1 << page.order();
                1 << page.order()
            } else if page.test(pg::HEAD) && page.test(pg::ANON) {
                movable += 1 << page.order();
                1 << page.order()
            } else {
                1
            };
            pfn += step;
        }
        (free, movable)
    }

    /// __move_freepages_block and set_pageblock_migratetype: the pageblock
    /// at `start` becomes `mt`, its free blocks move to the tails of `mt`'s
    /// lists.
    fn move_freepages_block(&mut self, start: u64, mt: MigrateType) {
        let end = (start + (1 << PAGEBLOCK_ORDER)).min(self.frontier);
        let mut blocks = Vec::new();
        let mut pfn = start;
        while pfn < end {
            let page = *self.memmap.page(Pfn(pfn));
            if page.test(pg::BUDDY) {
                blocks.push((pfn, page.order()));
                pfn += 1 << page.order();
            } else {
                pfn += 1;
            }
        }
        for &(pfn, order) in &blocks {
            self.del_page_from_free_list(pfn, order);
        }
        self.set_block_mt(start, mt);
        for order in 0..=MAX_PAGE_ORDER {
            let of_order: Vec<u64> = blocks
                .iter()
                .filter(|b| b.1 == order)
                .map(|b| b.0)
                .collect();
            self.add_to_free_list_tail(&of_order, order);
        }
    }

    /// __rmqueue_steal: the smallest free block of the other type, taken
    /// without claiming its pageblock (the rest stays on the other lists).
    fn rmqueue_steal(&mut self, order: u32, mt: MigrateType) -> Option<u64> {
        let other = mt.other();
        for cur in order..=MAX_PAGE_ORDER {
            if let Some(pfn) = self.free_area_head(cur, other) {
                self.del_page_from_free_list(pfn, cur);
                self.expand(pfn, order, cur);
                return Some(pfn);
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
            let o = (order..=block).find(|&o| {
                !self.free_area[o as usize][MigrateType::Movable as usize]
                    .list
                    .is_empty()
            });
            if let Some(o) = o {
                let pfn = u64::from(
                    *self.free_area[o as usize][MigrateType::Movable as usize]
                        .list
                        .last()
                        .expect("found"),
                );
                self.del_page_from_free_list(pfn, o);
                return Some((pfn, o));
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
        let lists: usize = self
            .free_area
            .iter()
            .flatten()
            .map(|a| a.list.capacity() * 4)
            .sum();
        self.memmap.footprint_bytes() + lists as u64
    }
}

/// PAGE_ALLOC_COSTLY_ORDER: orders above it are "costly" to the allocator.
pub const PAGE_ALLOC_COSTLY_ORDER: u32 = 3;

/// pageblock_order on x86_64 with THP: HPAGE_PMD_ORDER.
pub const PAGEBLOCK_ORDER: u32 = HPAGE_PMD_ORDER;

/// The compaction fields of `struct zone`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneCompact {
    pub considered: u32,
    pub defer_shift: u32,
    pub order_failed: u32,
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
        let lists = zone
            .free_area
            .iter()
            .flatten()
            .map(|a| a.list.clone())
            .collect();
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

#[cfg(test)]
mod mt_tests {
    use super::*;

    #[test]
    fn an_unmovable_allocation_claims_a_whole_block() {
        let mut zone = Zone::new(4096);
        let p = zone.alloc_pages_mt(0, MigrateType::Unmovable).unwrap();
        assert!(!zone.pageblock_movable(p), "{p}");
    }
}
