//! The deferred split queue: large anon folios waiting for the deferred
//! split shrinker, because they became partially mapped or (PMD THPs at
//! fault) as candidates for the under-used check.
//!
//! Follows Linux 6.18 `mm/huge_memory.c` (`struct deferred_split`,
//! `deferred_split_folio`, `__folio_unqueue_deferred_split`). A lower module
//! of its own because rmap (`__folio_remove_rmap`) queues and the free path
//! (`free_folio`) unqueues, below everything that splits; the shrinker that
//! drains the queue and splits (`deferred_split_scan`) stays in
//! `huge_memory`. Simplification: one queue (one node); a memcg's queue is
//! its part of it (see memcontrol).

use crate::mm_types::{pg, Pfn, HPAGE_PMD_ORDER};
use crate::vmstat::{MthpStat, VmEvent};
use crate::Machine;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The deferred split queue (one per node; the model has one node and no memcg).
/// Ordered by when a folio was queued, like the kernel's list.
#[derive(Default)]
pub struct DeferredSplitQueue {
    list: BTreeMap<u64, Pfn>,
    position: HashMap<Pfn, u64>,
    next: u64,
}

impl DeferredSplitQueue {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The queued folios, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Pfn> + '_ {
        self.list.values().copied()
    }

    /// Takes these folios off the queue (a memcg's part of it).
    pub(crate) fn remove_all(&mut self, folios: &[Pfn]) {
        for &folio in folios {
            self.remove(folio);
        }
    }

    pub(crate) fn add_tail(&mut self, folio: Pfn) {
        self.list.insert(self.next, folio);
        self.position.insert(folio, self.next);
        self.next += 1;
    }

    fn remove(&mut self, folio: Pfn) {
        if let Some(seq) = self.position.remove(&folio) {
            self.list.remove(&seq);
        }
    }

    /// A queued folio moved (compaction migrated it): it keeps its place.
    pub(crate) fn replace(&mut self, old: Pfn, new: Pfn) {
        if let Some(seq) = self.position.remove(&old) {
            self.list.insert(seq, new);
            self.position.insert(new, seq);
        }
    }

    /// Takes every queued folio off the queue, oldest first.
    pub fn drain(&mut self) -> Vec<Pfn> {
        self.position.clear();
        std::mem::take(&mut self.list).into_values().collect()
    }
}

/// deferred_split_folio: queue a large anon folio, either because it became
/// partially mapped or (PMD THPs at fault) as a candidate for the underused shrinker.
pub fn deferred_split_folio(m: &mut Machine, folio: Pfn, partially_mapped: bool) {
    let order = m.zone.memmap.page(folio).order();
    if order <= 1 || (!partially_mapped && !m.thp.shrink_underused) {
        return;
    }
    let head = m.zone.memmap.page_mut(folio);
    if partially_mapped && !head.test(pg::PARTIALLY_MAPPED) {
        head.set(pg::PARTIALLY_MAPPED);
        if order == HPAGE_PMD_ORDER {
            m.stat.count_vm_event(VmEvent::ThpDeferredSplitPage);
        }
        m.stat.count_mthp_stat(order, MthpStat::SplitDeferred);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, 1);
    }
    let head = m.zone.memmap.page_mut(folio);
    if !head.test(pg::DEFERRED) {
        head.set(pg::DEFERRED);
        m.deferred_split_queue.add_tail(folio);
    }
}

/// folio_unqueue_deferred_split, when a folio is freed.
pub fn folio_unqueue_deferred_split(m: &mut Machine, folio: Pfn, order: u32) {
    let head = m.zone.memmap.page_mut(folio);
    if !head.test(pg::DEFERRED) {
        return;
    }
    head.clear(pg::DEFERRED);
    if head.test(pg::PARTIALLY_MAPPED) {
        head.clear(pg::PARTIALLY_MAPPED);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, -1);
    }
    m.deferred_split_queue.remove(folio);
}
