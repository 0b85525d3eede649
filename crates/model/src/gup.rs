//! Long-term pins: `pin` and `unpin`, as io_uring fixed buffers take them.
//!
//! Follows Linux 6.18 `mm/gup.c` (`pin_user_pages` with FOLL_WRITE |
//! FOLL_LONGTERM, `faultin_page`, `try_grab_folio`, `unpin_user_pages`):
//! every page of the range is faulted in for writing first (a write fault,
//! counted as one, copy-on-write included), then pinned: a large folio's
//! `_pincount` and refcount grow by one per page, a small folio's refcount by
//! GUP_PIN_COUNTING_BIAS. Pinning marks the mm MMF_HAS_PINNED for good.
//!
//! Simplifications: io_uring afterwards drops all but one pin per large
//! folio (`io_coalesce_buffer`); nothing the model reports depends on how
//! many pins a pinned folio holds, so the model keeps the per-page count.
//! The pins belong to the ring, which a forked child shares: they go when
//! the range is unpinned or the last process holding the ring exits.

use crate::memory::{access_range, Access};
use crate::mm_types::{page_folio, Fault, Pfn, PAGE_SIZE, PMD_SIZE};
use crate::mmap::MmStruct;
use crate::page_alloc::free_folio;
use crate::pgtable::{pte_index, Pmd};
use crate::rmap::{self, GUP_PIN_COUNTING_BIAS};
use crate::Machine;

/// One pinned range: the pages it pinned, and the processes holding its ring.
#[derive(Clone, Debug)]
pub struct Pin {
    pub start: u64,
    pub len: u64,
    pub pages: Vec<Pfn>,
    pub holders: Vec<String>,
}

/// Why a pin failed, as io_uring_register reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PinError {
    /// Part of the range is unmapped or not writable.
    Efault,
    Oom,
}

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

/// pin_user_pages(FOLL_WRITE | FOLL_LONGTERM) over `[start, end)`.
pub fn pin_user_pages(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<Vec<Pfn>, PinError> {
    let mut addr = start;
    while addr < end {
        let vma = mm.find_vma(addr).ok_or(PinError::Efault)?;
        let piece_end = end.min(vma.end);
        // A store of nothing: faults like a write, leaves the data alone.
        let write = Access {
            step: PAGE_SIZE,
            write: true,
            zero: true,
            stores: false,
        };
        access_range(m, mm, &vma, addr, piece_end, write).map_err(|f| match f {
            // vm_fault_to_errno: VM_FAULT_SIGBUS is -EFAULT for GUP.
            Fault::Sigsegv { .. } | Fault::Sigbus { .. } => PinError::Efault,
            Fault::Oom | Fault::OomKilled => PinError::Oom,
        })?;
        addr = piece_end;
    }
    let mut pages = Vec::with_capacity(((end - start) / PAGE_SIZE) as usize);
    let mut addr = start;
    while addr < end {
        let page = follow_page(mm, addr).expect("a page faulted in for writing is mapped");
        try_grab_folio(m, page_folio(m, page), 1);
        pages.push(page);
        addr += PAGE_SIZE;
    }
    mm.has_pinned = true;
    Ok(pages)
}

/// try_grab_folio with FOLL_PIN: `refs` pins of one folio.
fn try_grab_folio(m: &mut Machine, folio: Pfn, refs: u32) {
    if m.zone.memmap.page(folio).order() > 0 {
        m.zone.memmap.page_mut(folio).private += refs;
        m.zone.memmap.page_mut(Pfn(folio.0 + 3)).private += refs;
    } else {
        m.zone.memmap.page_mut(folio).private += refs * GUP_PIN_COUNTING_BIAS;
    }
}

/// unpin_user_pages: drops the pins of `pages`, freeing folios whose last
/// reference they were.
pub fn unpin_user_pages(m: &mut Machine, pages: &[Pfn]) {
    for &page in pages {
        let folio = page_folio(m, page);
        let refs = if m.zone.memmap.page(folio).order() > 0 {
            m.zone.memmap.page_mut(Pfn(folio.0 + 3)).private -= 1;
            1
        } else {
            GUP_PIN_COUNTING_BIAS
        };
        if rmap::folio_put_refs(m, folio, refs) {
            free_folio(m, folio);
        }
    }
}
