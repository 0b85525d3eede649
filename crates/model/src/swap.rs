//! The LRU state of anonymous folios and the functions that move folios
//! between the lists: `folio_mark_lazyfree` (MADV_FREE), `folio_deactivate`
//! (MADV_COLD), and what reclaim sets (`folio_set_active` for
//! activate_locked, `folio_set_swapbacked` when a lazily-freed folio was
//! written again).
//!
//! Follows Linux 6.18 `mm/swap.c` (`folio_mark_lazyfree` / `lru_lazyfree`,
//! `folio_deactivate` / `lru_deactivate`) with the classic two-list LRU
//! (CONFIG_LRU_GEN is not set on the development machines). The flags are
//! PG_active, PG_swapbacked (a lazily-freed folio is anon and
//! !swapbacked, and lives on the inactive file list) and PG_dirty.
//!
//! Simplifications:
//! - The state lives beside the memory map, in `Machine::lru`, for the
//!   folios whose state is not the one every new anon folio starts with
//!   (inactive, swapbacked, clean): a workload that never uses MADV_FREE,
//!   COLD or PAGEOUT pays nothing. `page_alloc::free_folio` (and the small
//!   folio free of `zap_pte_range`) forget a freed folio's entry; a split
//!   hands the head's flags to every new folio (`__split_folio_to_order`
//!   copies PG_active, PG_swapbacked and PG_dirty).
//! - No per-cpu folio batches. The kernel queues an order-0 folio on its
//!   CPU's `lru_lazyfree` / `lru_deactivate` batch (31 folios) and counts
//!   PGLAZYFREE / PGDEACTIVATE only when the batch is moved (full, a large
//!   folio joins it: `folio_may_be_lru_cached`, or `lru_add_drain`); large
//!   folios never wait. The model moves every folio at once. The kernel
//!   backend makes the real kernel agree: its agents are pinned to one CPU
//!   and drain that CPU's batches (`lru_add_drain`, through a MADV_COLD of
//!   an empty page of their own) right after each MADV_FREE and MADV_COLD.
//! - Which mm and address map a lazily-freed order-0 folio is recorded when
//!   it is marked (MADV_FREE walks that mapping), since the model keeps no
//!   anon_vma or index for small folios; a large folio's mappings are found
//!   by `rmap::rmap_walk_anon`.

use crate::mm_types::{pg, MmId, Pfn, PAGE_SIZE};
use crate::vmstat::VmEvent;
use crate::Machine;
use rustc_hash::FxHashMap as HashMap;

/// PG_active.
pub const ACTIVE: u8 = 1 << 0;
/// !PG_swapbacked of an anon folio: lazily freed (MADV_FREE).
pub const LAZYFREE: u8 = 1 << 1;
/// PG_dirty.
pub const DIRTY: u8 = 1 << 2;

/// One folio's LRU state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LruFolio {
    pub flags: u8,
    /// The mm and address of a lazily-freed folio's mapping when it was
    /// marked (see the module doc).
    pub mm: MmId,
    pub addr: u64,
}

/// The folios whose LRU state is not the default (see the module doc).
#[derive(Default)]
pub struct Lru {
    folios: HashMap<Pfn, LruFolio>,
}

impl Lru {
    pub fn get(&self, folio: Pfn) -> LruFolio {
        self.folios.get(&folio).copied().unwrap_or_default()
    }

    #[inline]
    pub fn flags(&self, folio: Pfn) -> u8 {
        if self.folios.is_empty() {
            return 0;
        }
        self.get(folio).flags
    }

    pub fn is_empty(&self) -> bool {
        self.folios.is_empty()
    }

    pub fn len(&self) -> usize {
        self.folios.len()
    }

    /// Every folio with an entry, by pfn.
    pub fn entries(&self) -> Vec<(Pfn, LruFolio)> {
        let mut v: Vec<_> = self.folios.iter().map(|(p, f)| (*p, *f)).collect();
        v.sort_unstable_by_key(|(p, _)| *p);
        v
    }

    pub fn set(&mut self, folio: Pfn, entry: LruFolio) {
        if entry.flags == 0 {
            self.folios.remove(&folio);
        } else {
            self.folios.insert(folio, entry);
        }
    }

    fn update(&mut self, folio: Pfn, set: u8, clear: u8) {
        let mut e = self.get(folio);
        e.flags = (e.flags | set) & !clear;
        self.set(folio, e);
    }

    /// The folio is freed: it has no LRU state any more.
    #[inline]
    pub fn forget(&mut self, folio: Pfn) {
        if !self.folios.is_empty() {
            self.folios.remove(&folio);
        }
    }
}

fn folio_nr_pages(m: &Machine, folio: Pfn) -> u64 {
    1 << m.zone.memmap.page(folio).order()
}

/// folio_test_anon && !folio_test_swapbacked.
///
/// No kernel function: vmscan.c and rmap.c write this test out where they need it.
pub fn folio_test_lazyfree(m: &Machine, folio: Pfn) -> bool {
    m.lru.flags(folio) & LAZYFREE != 0
}

pub fn folio_test_active(m: &Machine, folio: Pfn) -> bool {
    m.lru.flags(folio) & ACTIVE != 0
}

pub fn folio_test_dirty(m: &Machine, folio: Pfn) -> bool {
    m.lru.flags(folio) & DIRTY != 0
}

pub fn folio_mark_dirty(m: &mut Machine, folio: Pfn) {
    m.lru.update(folio, DIRTY, 0);
}

pub fn folio_clear_dirty(m: &mut Machine, folio: Pfn) {
    m.lru.update(folio, 0, DIRTY);
}

pub fn folio_set_swapbacked(m: &mut Machine, folio: Pfn) {
    m.lru.update(folio, 0, LAZYFREE);
}

/// activate_locked in shrink_folio_list: PG_active.
pub fn folio_set_active(m: &mut Machine, folio: Pfn) {
    m.lru.update(folio, ACTIVE, 0);
}

/// folio_mark_lazyfree + lru_lazyfree: an anon, swapbacked folio becomes
/// clean-anon on the inactive (file) list, PGLAZYFREE counting its pages.
/// `mm` and `addr` say where it is mapped.
pub fn folio_mark_lazyfree(m: &mut Machine, folio: Pfn, mm: MmId, addr: u64) {
    let page = m.zone.memmap.page(folio);
    if !page.test(pg::ANON) || folio_test_lazyfree(m, folio) {
        return;
    }
    let nr = folio_nr_pages(m, folio);
    let mut e = m.lru.get(folio);
    e.flags = (e.flags | LAZYFREE) & !ACTIVE;
    e.mm = mm;
    e.addr = addr;
    m.lru.set(folio, e);
    m.stat.count_vm_events(VmEvent::PgLazyfree, nr);
}

/// folio_deactivate + lru_deactivate: an active folio moves to the inactive
/// list, PGDEACTIVATE counting its pages; an inactive one stays.
pub fn folio_deactivate(m: &mut Machine, folio: Pfn) {
    if !folio_test_active(m, folio) {
        return;
    }
    m.lru.update(folio, 0, ACTIVE);
    m.stat
        .count_vm_events(VmEvent::PgDeactivate, folio_nr_pages(m, folio));
}

/// What `__split_folio_to_order` copies from the head of a split folio to
/// each new order-0 folio: PG_active, PG_swapbacked, PG_dirty. Called with
/// the old head's state before the split, for page `i`.
///
/// No kernel function: the LRU-flag lines of __split_folio_to_order, kept here beside the rest of the LRU state.
pub fn split_folio_lru(m: &mut Machine, head: LruFolio, page: Pfn, i: u64) {
    if head.flags == 0 {
        return;
    }
    m.lru.set(
        page,
        LruFolio {
            flags: head.flags,
            mm: head.mm,
            addr: head.addr + i * PAGE_SIZE,
        },
    );
}
