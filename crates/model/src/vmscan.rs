//! `reclaim`: memory pressure as `echo 2 > /proc/sys/vm/drop_caches` applies
//! it, which is what the kernel backend does: every slab shrinker runs
//! until it frees little more (drop_slab). Two matter to anonymous THPs,
//! both in `huge_memory`: the deferred split shrinker (`deferred_split_scan`,
//! with the under-used THP check) and the huge zero folio's
//! (`shrink_huge_zero_folio_scan`).
//!
//! Follows Linux 6.18 `mm/vmscan.c` (drop_slab, shrink_slab), as
//! `drop_caches_sysctl_handler` (fs/drop_caches.c) calls it. Simplifications:
//! one node and no memcg, so shrink_slab is one call of each shrinker; each
//! shrinker walks its whole queue in one call, which is what drop_slab's
//! repeated batches amount to when nothing fails; a split that fails (a
//! pinned folio) is tried once per `reclaim` here, while drop_slab retries it
//! as long as other shrinkers free enough, which is why
//! thp_split_page_failed is an attempt count that `diff` treats as a bound;
//! page reclaim itself (LRU, swap) is not run: drop_caches does not run it
//! either.

use crate::huge_memory::{deferred_split_scan, shrink_huge_zero_folio_scan};
use crate::rmap::MmList;
use crate::Machine;

/// drop_slab: the shrinkers that concern anonymous memory, in turn.
pub fn drop_slab(m: &mut Machine, mms: &mut MmList) {
    deferred_split_scan(m, mms);
    shrink_huge_zero_folio_scan(m);
}
