//! The memory map: `struct page` for every frame, allocated a section at a time.
//!
//! Follows Linux 6.18 `mm/sparse.c` (SPARSEMEM with 128 MiB sections on x86_64,
//! SECTION_SIZE_BITS = 27) and the spirit of DEFERRED_STRUCT_PAGE_INIT: a section's
//! pages are created only when the buddy allocator first hands out memory from
//! it, so a terabyte machine costs nothing until a workload touches it.
//!
//! Beside the pages, each section may hold the `FolioExt` of its large
//! folios (one slot per 4 frames: large anon folios have order >= 2, so their
//! heads are 4-aligned), created when the section first holds a large folio:
//! a workload of small folios never pays for them.

use crate::mm_types::{pg, FolioExt, Page, Pfn};
use crate::Machine;

pub const PFN_SECTION_SHIFT: u32 = 27 - crate::mm_types::PAGE_SHIFT;
pub const PAGES_PER_SECTION: u64 = 1 << PFN_SECTION_SHIFT;

pub struct MemMap {
    sections: Vec<Option<Box<[Page]>>>,
    folio_ext: Vec<Option<Box<[FolioExt]>>>,
}

/// Frames per `FolioExt` slot: the smallest large anon folio.
const FRAMES_PER_EXT: u64 = 4;

impl MemMap {
    pub fn new(nr_pages: u64) -> Self {
        let nr_sections = nr_pages.div_ceil(PAGES_PER_SECTION) as usize;
        MemMap {
            sections: (0..nr_sections).map(|_| None).collect(),
            folio_ext: (0..nr_sections).map(|_| None).collect(),
        }
    }

    /// Makes sure the section holding `pfn` has its pages (sparse_init_one_section).
    pub fn online_section(&mut self, pfn: Pfn) {
        let slot = &mut self.sections[(pfn.0 >> PFN_SECTION_SHIFT) as usize];
        if slot.is_none() {
            *slot = Some(vec![Page::default(); PAGES_PER_SECTION as usize].into_boxed_slice());
        }
    }

    /// pfn_to_page. The section must be online: every frame the allocator has
    /// handed out or taken back is.
    #[inline]
    pub fn page(&self, pfn: Pfn) -> &Page {
        let section = self.sections[(pfn.0 >> PFN_SECTION_SHIFT) as usize]
            .as_deref()
            .expect("pfn_to_page on an offline section");
        &section[(pfn.0 & (PAGES_PER_SECTION - 1)) as usize]
    }

    #[inline]
    pub fn page_mut(&mut self, pfn: Pfn) -> &mut Page {
        let section = self.sections[(pfn.0 >> PFN_SECTION_SHIFT) as usize]
            .as_deref_mut()
            .expect("pfn_to_page on an offline section");
        &mut section[(pfn.0 & (PAGES_PER_SECTION - 1)) as usize]
    }

    /// The pages of `[pfn, pfn + nr)`, which must lie in one section (a folio
    /// never crosses a section: MAX_PAGE_ORDER blocks are section-aligned).
    #[inline]
    pub fn pages_mut(&mut self, pfn: Pfn, nr: u64) -> &mut [Page] {
        let section = self.sections[(pfn.0 >> PFN_SECTION_SHIFT) as usize]
            .as_deref_mut()
            .expect("pfn_to_page on an offline section");
        let first = (pfn.0 & (PAGES_PER_SECTION - 1)) as usize;
        &mut section[first..first + nr as usize]
    }

    pub fn pages(&self, pfn: Pfn, nr: u64) -> &[Page] {
        let section = self.sections[(pfn.0 >> PFN_SECTION_SHIFT) as usize]
            .as_deref()
            .expect("pfn_to_page on an offline section");
        let first = (pfn.0 & (PAGES_PER_SECTION - 1)) as usize;
        &section[first..first + nr as usize]
    }

    /// The `FolioExt` of the large folio headed at `folio`, whose section
    /// holds (or held) a large folio.
    #[inline]
    pub fn folio_ext(&self, folio: Pfn) -> &FolioExt {
        debug_assert_eq!(folio.0 % FRAMES_PER_EXT, 0, "{folio} heads no large folio");
        let ext = self.folio_ext[(folio.0 >> PFN_SECTION_SHIFT) as usize]
            .as_deref()
            .expect("folio_ext of a section that never held a large folio");
        &ext[((folio.0 & (PAGES_PER_SECTION - 1)) / FRAMES_PER_EXT) as usize]
    }

    /// The `FolioExt` of the large folio headed at `folio`, creating the
    /// section's slots on first use.
    #[inline]
    pub fn folio_ext_mut(&mut self, folio: Pfn) -> &mut FolioExt {
        debug_assert_eq!(folio.0 % FRAMES_PER_EXT, 0, "{folio} heads no large folio");
        let ext =
            self.folio_ext[(folio.0 >> PFN_SECTION_SHIFT) as usize].get_or_insert_with(|| {
                vec![FolioExt::default(); (PAGES_PER_SECTION / FRAMES_PER_EXT) as usize]
                    .into_boxed_slice()
            });
        &mut ext[((folio.0 & (PAGES_PER_SECTION - 1)) / FRAMES_PER_EXT) as usize]
    }

    /// Bytes of host memory the memory map uses (for the benchmark).
    pub fn footprint_bytes(&self) -> u64 {
        let online = self.sections.iter().filter(|s| s.is_some()).count() as u64;
        let ext = self.folio_ext.iter().filter(|s| s.is_some()).count() as u64;
        online * PAGES_PER_SECTION * std::mem::size_of::<Page>() as u64
            + ext * PAGES_PER_SECTION / FRAMES_PER_EXT * std::mem::size_of::<FolioExt>() as u64
            + (self.sections.len() * 2 * std::mem::size_of::<Option<Box<[Page]>>>()) as u64
    }
}

/// page_folio (include/linux/page-flags.h): the head of the folio that
/// `page` belongs to, found in the memmap, which is why it lives here. The
/// kernel follows the tail's compound_head pointer; a model tail keeps its folio's
/// order in its order bits instead (`alloc_folio`), and folios are
/// naturally aligned.
#[inline]
pub fn page_folio(m: &Machine, page: Pfn) -> Pfn {
    let p = m.zone.memmap.page(page);
    if p.test(pg::HEAD) {
        return page;
    }
    debug_assert!(p.test(pg::TAIL), "{page} belongs to no folio");
    let head = Pfn(page.0 & !((1u64 << p.order()) - 1));
    debug_assert!(m.zone.memmap.page(head).test(pg::HEAD));
    head
}
