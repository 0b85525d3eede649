//! Finding the page mapped at an address, for the walks that need only that
//! (debugfs split, pinning, the utilization report).
//!
//! Follows Linux 6.18 `mm/pagewalk.c` (`folio_walk_start`, which replaced
//! `follow_page` in 6.12). Simplification: it returns the page alone, not
//! the folio, the mapping level and the locked page table.

use crate::mm_types::{MmStruct, Pfn, PMD_SIZE};
use crate::pgtable::{pte_index, Pmd};

/// The page mapped at `addr`, if any (follow_page_mask; not the zero pages).
///
/// Named for follow_page, which 6.12 replaced by folio_walk_start; the model's callers want just the page.
pub(crate) fn follow_page(mm: &MmStruct, addr: u64) -> Option<Pfn> {
    match mm.pmds.get(&(addr / PMD_SIZE))? {
        Pmd::Huge { pfn, .. } => Some(Pfn(pfn.0 + pte_index(addr) as u64)),
        Pmd::HugeZero { .. } => None,
        Pmd::Table(t) => t.ptes[pte_index(addr)].pfn(),
    }
}
