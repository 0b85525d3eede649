//! What /proc/PID/smaps, smaps_rollup and pagemap would show for a range.
//!
//! Follows Linux 6.18 `fs/proc/task_mmu.c` (`smaps_pte_entry`, `smaps_pmd_entry`,
//! `smaps_account`, `smaps_hugetlb_range`) with CONFIG_PAGE_MAPCOUNT: the zero pages are not counted;
//! a page of a folio with refcount 1 counts whole to Pss, otherwise its share is
//! 1/mapcount (its PTE mappings plus the folio's PMD mappings); AnonHugePages
//! counts PMD-mapped anon folios only; a page is Shared_* when mapped twice or
//! more, else Private_*; *_Dirty when its PTE or PMD is dirty or its folio
//! PG_dirty, else *_Clean (anon memory is clean only after MADV_FREE); a page
//! of a lazily-freed folio (anon, !swapbacked) that is not dirty that way
//! counts in LazyFree.
//! Pss is kept in the kernel's fixed point (PSS_SHIFT = 12) and truncated to
//! kB at the end, as `SEQ_PUT_DEC` does.
//! A page cache page (`filemap`) is in Rss and Pss but not Anonymous; its
//! PG_dirty is its own `pg::DIRTY`.
//! `folios` is hugelab's own summary of what pagemap + kpageflags reveal: how
//! many folios of each size map into the range (page cache pages too, as
//! the kernel backend counts every present page), and whether by PMD or by
//! PTEs.

use crate::internal::folio_pte_batch;
use crate::mm_types::{
    pg, MmStruct, Pfn, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE, PTRS_PER_PTE,
};
use crate::pgtable::Pmd;
use crate::rmap::{folio_entire_mapcount, folio_nr_pages_mapped, folio_ref_count};
use crate::sparse::page_folio;
use crate::Machine;
use hugelab_workload::smaps::SmapsField;
use rustc_hash::FxHashSet as HashSet;

const PSS_SHIFT: u32 = 12;

/// The smaps fields the model computes, in bytes (Pss in PSS_SHIFT fixed point).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemSizeStats {
    pub resident: u64,
    pub shared_dirty: u64,
    pub private_dirty: u64,
    pub pss: u64,
    pub anonymous: u64,
    pub lazyfree: u64,
    pub anonymous_thp: u64,
    pub shared_clean: u64,
    pub private_clean: u64,
    /// HugeTLB pages mapped more than once / once (smaps_hugetlb_range);
    /// not in Rss.
    pub shared_hugetlb: u64,
    pub private_hugetlb: u64,
}

impl MemSizeStats {
    /// (field, kB) pairs, in smaps order and spelling ([`SmapsField::ALL`]).
    pub fn fields(&self) -> [(&'static str, u64); SmapsField::ALL.len()] {
        SmapsField::ALL.map(|f| (f.name(), self.kb(f)))
    }

    /// A field in kB, as `__show_smap` prints it (Pss truncated from its
    /// fixed point).
    fn kb(&self, f: SmapsField) -> u64 {
        match f {
            SmapsField::Rss => self.resident >> 10,
            SmapsField::Pss => self.pss >> (10 + PSS_SHIFT),
            SmapsField::SharedClean => self.shared_clean >> 10,
            SmapsField::SharedDirty => self.shared_dirty >> 10,
            SmapsField::PrivateClean => self.private_clean >> 10,
            SmapsField::PrivateDirty => self.private_dirty >> 10,
            SmapsField::Anonymous => self.anonymous >> 10,
            SmapsField::LazyFree => self.lazyfree >> 10,
            SmapsField::AnonHugePages => self.anonymous_thp >> 10,
            SmapsField::SharedHugetlb => self.shared_hugetlb >> 10,
            SmapsField::PrivateHugetlb => self.private_hugetlb >> 10,
        }
    }

    /// smaps_page_accumulate for anon memory.
    fn accumulate(&mut self, size: u64, pss: u64, private: bool, dirty: bool) {
        self.pss += pss;
        match (private, dirty) {
            (true, true) => self.private_dirty += size,
            (false, true) => self.shared_dirty += size,
            (true, false) => self.private_clean += size,
            (false, false) => self.shared_clean += size,
        }
    }
}

/// smaps_account for `nr` pages from `page` of `folio`: a folio with refcount
/// 1 is private and counts whole; otherwise each page is shared when mapped
/// twice or more (folio_precise_page_mapcount: its PTE mappings plus the
/// folio's PMD mappings) and its Pss is 1/mapcount. A pinned page mapped once
/// is private, with all of its Pss. `dirty(i)` is the dirty bit of the
/// mapping of page `i` of the `nr`.
fn smaps_account(
    m: &Machine,
    mss: &mut MemSizeStats,
    folio: Pfn,
    page: Pfn,
    nr: u64,
    dirty: &dyn Fn(u64) -> bool,
) {
    let size = nr * PAGE_SIZE;
    mss.resident += size;
    mss.anonymous += size;
    let lru = m.lru.flags(folio);
    let folio_dirty = lru & crate::swap::DIRTY != 0;
    let lazyfree = lru & crate::swap::LAZYFREE != 0;
    let all_dirty = folio_dirty || (0..nr).all(dirty);
    if lazyfree && !folio_dirty {
        mss.lazyfree += (0..nr).filter(|&i| !dirty(i)).count() as u64 * PAGE_SIZE;
    }
    if folio_ref_count(m, folio) == 1 {
        if all_dirty {
            mss.accumulate(size, size << PSS_SHIFT, true, true);
        } else {
            for i in 0..nr {
                let d = folio_dirty || dirty(i);
                mss.accumulate(PAGE_SIZE, PAGE_SIZE << PSS_SHIFT, true, d);
            }
        }
        return;
    }
    let entire = if m.zone.memmap.page(folio).order() > 0 {
        u64::from(folio_entire_mapcount(m, folio))
    } else {
        0
    };
    if entire > 0 && folio_nr_pages_mapped(m, folio) == 0 && all_dirty {
        // Mapped by PMDs only: every page has the same mapcount, so the
        // per-page sum is one product.
        mss.accumulate(
            size,
            nr * ((PAGE_SIZE << PSS_SHIFT) / entire),
            entire < 2,
            true,
        );
        return;
    }
    let mut share = (0u64, 0u64);
    for (i, p) in m.zone.memmap.pages(page, nr).iter().enumerate() {
        let mapcount = (u64::from(p.mapcount) + entire).max(1);
        if share.0 != mapcount {
            share = (mapcount, (PAGE_SIZE << PSS_SHIFT) / mapcount);
        }
        let d = folio_dirty || dirty(i as u64);
        mss.accumulate(PAGE_SIZE, share.1, mapcount < 2, d);
    }
}

/// Folios mapped in a range: per order, how many, and how many by a PMD.
#[derive(Default)]
pub struct FolioCounts {
    pub total: [u64; HPAGE_PMD_ORDER as usize + 1],
    pub pmd_mapped: [u64; HPAGE_PMD_ORDER as usize + 1],
    /// Large folios already counted (a folio may show up in several places).
    seen: HashSet<Pfn>,
}

impl FolioCounts {
    fn count(&mut self, folio: Pfn, order: u32, pmd: bool) {
        if order > 0 && !self.seen.insert(folio) {
            return;
        }
        self.total[order as usize] += 1;
        self.pmd_mapped[order as usize] += u64::from(pmd);
    }
}

/// Walks the page tables of `[start, end)`, adding to the smaps totals and
/// the folio counts.
pub fn walk_range(
    m: &Machine,
    mm: &MmStruct,
    start: u64,
    end: u64,
    mss: &mut MemSizeStats,
    folios: &mut FolioCounts,
) {
    if start >= end {
        return;
    }
    if let Some(vma) = mm.find_vma(start).filter(|v| v.hugetlb.is_some()) {
        let (shared, private) = crate::hugetlb::smaps_hugetlb_range(m, mm, &vma, start, end);
        mss.shared_hugetlb += shared;
        mss.private_hugetlb += private;
        return;
    }
    for (index, pmd) in mm.pmds.range(start / PMD_SIZE..=(end - 1) / PMD_SIZE) {
        let slot = index * PMD_SIZE;
        match pmd {
            Pmd::Huge { pfn, dirty, .. } => {
                let dirty = *dirty;
                smaps_account(m, mss, *pfn, *pfn, HPAGE_PMD_NR, &|_| dirty);
                mss.anonymous_thp += PMD_SIZE;
                folios.count(*pfn, HPAGE_PMD_ORDER, true);
            }
            Pmd::HugeZero { .. } => {}
            Pmd::Table(t) => {
                let lo = ((start.max(slot) - slot) / PAGE_SIZE) as usize;
                let hi = ((end.min(slot + PMD_SIZE) - slot) / PAGE_SIZE) as usize;
                // The Pss share of a small page mapped `mapcount` times,
                // for the last mapcount seen (a division saved per page).
                let mut share = (0u64, 0u64);
                let ptes = &t.ptes[..hi.min(PTRS_PER_PTE)];
                let mut i = lo;
                while i < ptes.len() {
                    let Some(pfn) = ptes[i].pfn() else {
                        i += 1;
                        continue;
                    };
                    let page = m.zone.memmap.page(pfn);
                    if page.is_small_folio() {
                        // smaps_account for a small folio: one page says it all.
                        // A page cache page (filemap) is not anonymous; its
                        // PG_dirty is its own flag.
                        let file = !page.test(pg::ANON);
                        mss.resident += PAGE_SIZE;
                        mss.anonymous += if file { 0 } else { PAGE_SIZE };
                        let lru = m.lru.flags(pfn);
                        let folio_dirty = if file {
                            page.test(pg::DIRTY)
                        } else {
                            lru & crate::swap::DIRTY != 0
                        };
                        let dirty = t.pte_dirty(i) || folio_dirty;
                        if lru & crate::swap::LAZYFREE != 0 && !dirty {
                            mss.lazyfree += PAGE_SIZE;
                        }
                        if page.private == 1 {
                            mss.accumulate(PAGE_SIZE, PAGE_SIZE << PSS_SHIFT, true, dirty);
                        } else {
                            let mapcount = u64::from(page.mapcount).max(1);
                            if share.0 != mapcount {
                                share = (mapcount, (PAGE_SIZE << PSS_SHIFT) / mapcount);
                            }
                            mss.accumulate(PAGE_SIZE, share.1, mapcount < 2, dirty);
                        }
                        folios.total[0] += 1;
                        i += 1;
                        continue;
                    }
                    // A large folio: its PTE batch at once.
                    let folio = page_folio(m, pfn);
                    let nr = folio_pte_batch(m, folio, &ptes[i..], ptes.len() - i);
                    let base = i;
                    smaps_account(m, mss, folio, pfn, nr as u64, &|k| {
                        t.pte_dirty(base + k as usize)
                    });
                    folios.count(folio, m.zone.memmap.page(folio).order(), false);
                    i += nr;
                }
            }
        }
    }
}
