//! HugeTLB Vmemmap Optimization (HVO): how much `struct page` memory (the
//! vmemmap) each HugeTLB page has, and how much of it HVO gives back.
//!
//! Follows Linux 6.18 `mm/hugetlb_vmemmap.h`: `hugetlb_vmemmap_size` (one
//! `struct page` per base page of the huge page) and
//! `hugetlb_vmemmap_optimizable_size` (all of it but
//! `HUGETLB_VMEMMAP_RESERVE_SIZE`, one base page that every other vmemmap
//! address of the huge page is remapped to; nothing unless `sizeof(struct
//! page)` is a power of 2). The rule of the series that introduced HVO
//! (Muchun Song, 2021, Linux 5.14; seed 003) kept two vmemmap pages
//! (`RESERVE_VMEMMAP_NR`): the head page's, and the first tail page's, which
//! the other tail pages were remapped to. The series itself names the
//! difference as future work, and later kernels keep one.
//!
//! The optimization itself follows `mm/hugetlb_vmemmap.c`
//! (`hugetlb_vmemmap_optimize_folio`, `hugetlb_vmemmap_restore_folio`):
//! - a HugeTLB page is optimized when it is allocated from the buddy
//!   allocator (pool growth, surplus pages) while `vm.hugetlb_optimize_vmemmap`
//!   is 1; pages allocated before keep their vmemmap;
//! - 6.18's `vmemmap_remap_free` first copies the head vmemmap page into a
//!   newly allocated page (`nr_memmap_pages` +1), remaps the whole range to
//!   it and frees all the original vmemmap pages; a page that came from the
//!   boot memmap (PageReserved) is freed with `free_bootmem_page`
//!   (`nr_memmap_boot_pages` -1, and MemTotal grows by it), one that an
//!   earlier restore allocated goes back to the buddy allocator
//!   (`nr_memmap_pages` -1). If the copy cannot be allocated, the original
//!   head page is kept. The 2021 rule keeps the first two pages and frees
//!   the rest, with no copy;
//! - when the page goes back to the buddy allocator, `vmemmap_remap_alloc`
//!   allocates the freed pages again (`nr_memmap_pages` + that many); if it
//!   cannot, the caller keeps the HugeTLB page (see `hugetlb`).
//!
//! The model knows, for each vmemmap page (one per 64 frames), whether it
//! is still the boot memmap's or a frame of the zone, so which of the two
//! counters moves follows the machine's history, as on the kernel. Frames
//! freed from the boot memmap count in MemTotal and MemFree but are not
//! handed out again (the model's zone has a fixed size): a simplification
//! that changes no counter but which frame a later allocation gets.
//! Not modelled: the vmemmap PMD split before a first optimization (a
//! kernel page-table page, not counted in NR_PAGETABLE), HVO of boot-time
//! pages (`hugetlb_vmemmap_optimize_bootmem_folios`), demotion.

use crate::mm_types::Pfn;
use crate::mmzone::Zone;
use rustc_hash::FxHashMap as HashMap;

/// Which HVO rule: how many vmemmap pages a HugeTLB page keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum HvoRule {
    /// Linux 6.18: one page kept (`HUGETLB_VMEMMAP_RESERVE_SIZE` is
    /// PAGE_SIZE).
    #[default]
    Linux618,
    /// The 2021 series (Linux 5.14): two pages kept (`RESERVE_VMEMMAP_NR`).
    Series2021,
}

impl HvoRule {
    pub const ALL: [HvoRule; 2] = [HvoRule::Series2021, HvoRule::Linux618];

    /// Vmemmap pages a HugeTLB page keeps under this rule.
    pub fn reserved_pages(self) -> u64 {
        match self {
            HvoRule::Linux618 => 1,
            HvoRule::Series2021 => 2,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            HvoRule::Linux618 => "Linux 6.18",
            HvoRule::Series2021 => "2021 series (5.14)",
        }
    }
}

/// The machine's shape that the vmemmap depends on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VmemmapGeometry {
    /// The base page size (PAGE_SIZE), in bytes.
    pub base_page: u64,
    /// sizeof(struct page), in bytes (64 on x86_64 by default).
    pub struct_page: u64,
}

impl Default for VmemmapGeometry {
    fn default() -> Self {
        VmemmapGeometry {
            base_page: crate::mm_types::PAGE_SIZE,
            struct_page: 64,
        }
    }
}

/// hugetlb_vmemmap_size: bytes of `struct page` for one HugeTLB page of
/// `hpage_size` bytes.
pub fn hugetlb_vmemmap_size(g: VmemmapGeometry, hpage_size: u64) -> u64 {
    hpage_size / g.base_page * g.struct_page
}

/// hugetlb_vmemmap_optimizable_size in base pages: how many vmemmap pages
/// HVO frees per HugeTLB page under `rule`.
pub fn hugetlb_vmemmap_optimizable_pages(
    g: VmemmapGeometry,
    hpage_size: u64,
    rule: HvoRule,
) -> u64 {
    if !g.struct_page.is_power_of_two() {
        return 0;
    }
    let size = hugetlb_vmemmap_size(g, hpage_size);
    let reserve = rule.reserved_pages() * g.base_page;
    size.saturating_sub(reserve) / g.base_page
}

/// The vmemmap of the machine: the HVO sysctl and rule, what each HugeTLB
/// page's vmemmap is now, and the memmap counters.
#[derive(Default)]
pub struct Vmemmap {
    /// vm.hugetlb_optimize_vmemmap.
    pub optimize: bool,
    pub rule: HvoRule,
    /// sizeof(struct page) and the base page (`machine struct_page=`).
    pub geometry: VmemmapGeometry,
    /// Vmemmap pages that are frames of the zone (allocated by a restore,
    /// or a head copy), by vmemmap page index (pfn / 64); the others are
    /// the boot memmap's, or freed.
    zone_backed: HashMap<u64, Pfn>,
    /// Optimized HugeTLB pages (head pfn): the head copy, if one was made.
    optimized: HashMap<Pfn, Option<Pfn>>,
    /// NR_MEMMAP and NR_MEMMAP_BOOT, as changes since boot.
    pub nr_memmap_pages: i64,
    pub nr_memmap_boot_pages: i64,
    /// Frames the boot memmap gave to the buddy allocator (MemTotal grows).
    pub boot_pages_freed: u64,
}

impl Vmemmap {
    /// Vmemmap pages per HugeTLB page of `nr` frames; 0 (nothing to
    /// optimize) when `sizeof(struct page)` is not a power of two or the
    /// vmemmap of a huge page is no whole number of pages.
    fn pages(&self, nr: u64) -> u64 {
        let g = self.geometry;
        let bytes = hugetlb_vmemmap_size(g, nr * g.base_page);
        if !g.struct_page.is_power_of_two() || !bytes.is_multiple_of(g.base_page) {
            return 0;
        }
        bytes / g.base_page
    }

    /// The vmemmap page that describes frame `pfn`.
    fn index(&self, pfn: Pfn) -> u64 {
        pfn.0 * self.geometry.struct_page / self.geometry.base_page
    }

    /// Vmemmap pages the rule keeps (none copied yet).
    fn kept(&self) -> u64 {
        self.rule.reserved_pages()
    }

    pub fn is_optimized(&self, folio: Pfn) -> bool {
        self.optimized.contains_key(&folio)
    }

    /// Zone frames holding vmemmap (for the frame accounting of debug_vm).
    pub fn zone_frames(&self) -> u64 {
        self.zone_backed.len() as u64
            + self.optimized.values().filter(|h| h.is_some()).count() as u64
    }

    /// free_vmemmap_page for vmemmap page `index`.
    fn free_vmemmap_page(&mut self, zone: &mut Zone, index: u64) {
        match self.zone_backed.remove(&index) {
            Some(frame) => {
                self.nr_memmap_pages -= 1;
                zone.free_pages(frame, 0);
            }
            None => {
                self.nr_memmap_boot_pages -= 1;
                self.boot_pages_freed += 1;
            }
        }
    }

    /// hugetlb_vmemmap_optimize_folio for the HugeTLB page of `nr` frames
    /// at `folio`: nothing unless the sysctl is on and there is something
    /// to free.
    pub fn hugetlb_vmemmap_optimize_folio(&mut self, zone: &mut Zone, folio: Pfn, nr: u64) {
        let pages = self.pages(nr);
        if !self.optimize || pages <= self.kept() || self.optimized.contains_key(&folio) {
            return;
        }
        let first = self.index(folio);
        let (head, from) = match self.rule {
            HvoRule::Linux618 => match zone.alloc_pages(0) {
                Some(copy) => {
                    self.nr_memmap_pages += 1;
                    (Some(copy), 0)
                }
                None => (None, 1),
            },
            HvoRule::Series2021 => (None, 2),
        };
        for index in first + from..first + pages {
            self.free_vmemmap_page(zone, index);
        }
        self.optimized.insert(folio, head);
    }

    /// hugetlb_vmemmap_restore_folio: the freed vmemmap pages allocated
    /// again; false (and nothing changed) when the zone has too few frames.
    pub fn hugetlb_vmemmap_restore_folio(&mut self, zone: &mut Zone, folio: Pfn, nr: u64) -> bool {
        let Some(&head) = self.optimized.get(&folio) else {
            return true;
        };
        let pages = self.pages(nr);
        let first = self.index(folio);
        // vmemmap_remap_alloc gives back all but the kept pages: 6.18's one
        // (the head copy, or the original head when no copy was made) or
        // the 2021 rule's two.
        let from = self.kept();
        let mut frames = Vec::with_capacity((pages - from) as usize);
        for _ in from..pages {
            match zone.alloc_pages(0) {
                Some(f) => frames.push(f),
                None => {
                    for f in frames {
                        zone.free_pages(f, 0);
                    }
                    return false;
                }
            }
        }
        self.nr_memmap_pages += frames.len() as i64;
        for (index, frame) in (first + from..first + pages).zip(frames) {
            self.zone_backed.insert(index, frame);
        }
        if let Some(copy) = head {
            // The copy stays the head page's vmemmap.
            self.zone_backed.insert(first, copy);
        }
        self.optimized.remove(&folio);
        true
    }
}

/// What HVO does to `total` bytes of HugeTLB pages of `hpage_size` each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct VmemmapPlan {
    pub hpage_size: u64,
    pub rule: HvoRule,
    pub huge_pages: u64,
    /// Vmemmap bytes of one huge page, and how many base pages of it HVO
    /// frees.
    pub vmemmap_bytes_per_hpage: u64,
    pub freed_pages_per_hpage: u64,
    /// Bytes of vmemmap for all of them, without and with HVO.
    pub vmemmap_bytes: u64,
    pub vmemmap_bytes_hvo: u64,
}

impl VmemmapPlan {
    pub fn saved_bytes(&self) -> u64 {
        self.vmemmap_bytes - self.vmemmap_bytes_hvo
    }
}

/// The vmemmap of `total` bytes of HugeTLB pages of `hpage_size`, without
/// and with HVO under `rule` (whole huge pages only).
pub fn vmemmap_plan(g: VmemmapGeometry, total: u64, hpage_size: u64, rule: HvoRule) -> VmemmapPlan {
    let huge_pages = total / hpage_size;
    // The memmap is one array: a huge page's share of it need not fill
    // whole pages (64K base pages), though HVO only ever frees whole ones.
    let per_hpage = hugetlb_vmemmap_size(g, hpage_size);
    let freed = hugetlb_vmemmap_optimizable_pages(g, hpage_size, rule);
    VmemmapPlan {
        hpage_size,
        rule,
        huge_pages,
        vmemmap_bytes_per_hpage: per_hpage,
        freed_pages_per_hpage: freed,
        vmemmap_bytes: huge_pages * per_hpage,
        vmemmap_bytes_hvo: huge_pages * (per_hpage - freed * g.base_page),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    const TIB: u64 = 1 << 40;

    #[test]
    fn the_pages_the_kernel_frees_per_huge_page() {
        let g = VmemmapGeometry::default();
        let freed = |size, rule| hugetlb_vmemmap_optimizable_pages(g, size, rule);
        // Seed 003: 8 vmemmap pages per 2M page, 6 freed; 4094 of 4096 per 1G.
        assert_eq!(hugetlb_vmemmap_size(g, 2 * MIB), 8 * 4096);
        assert_eq!(freed(2 * MIB, HvoRule::Series2021), 6);
        assert_eq!(freed(GIB, HvoRule::Series2021), 4094);
        assert_eq!(freed(2 * MIB, HvoRule::Linux618), 7);
        assert_eq!(freed(GIB, HvoRule::Linux618), 4095);
    }

    #[test]
    fn seed_003s_savings_per_tib_come_from_the_2021_rule() {
        let g = VmemmapGeometry::default();
        let saved = |size, rule| vmemmap_plan(g, TIB, size, rule).saved_bytes();
        // "we can save ~16GB (1G hugepage)/~12GB (2MB hugepage) memory".
        assert_eq!(saved(2 * MIB, HvoRule::Series2021), 12 * GIB);
        assert_eq!(saved(GIB, HvoRule::Series2021), 16 * GIB - 8 * MIB);
        assert_eq!(saved(2 * MIB, HvoRule::Linux618), 14 * GIB);
        assert_eq!(saved(GIB, HvoRule::Linux618), 16 * GIB - 4 * MIB);
    }

    #[test]
    fn no_hvo_without_a_power_of_two_struct_page_or_room_to_free() {
        let odd = VmemmapGeometry {
            base_page: 4096,
            struct_page: 56,
        };
        assert_eq!(
            hugetlb_vmemmap_optimizable_pages(odd, 2 * MIB, HvoRule::Linux618),
            0
        );
        // 64K base pages: a 2M page has 32 struct pages, 2 KiB, under one
        // base page: nothing to free.
        let big = VmemmapGeometry {
            base_page: 64 << 10,
            struct_page: 64,
        };
        assert_eq!(
            hugetlb_vmemmap_optimizable_pages(big, 2 * MIB, HvoRule::Linux618),
            0
        );
        let plan = vmemmap_plan(big, TIB, 2 * MIB, HvoRule::Linux618);
        assert_eq!((plan.vmemmap_bytes, plan.saved_bytes()), (TIB / 1024, 0));
    }

    /// A 2M HugeTLB page's frames, taken from `zone` as the pool takes them.
    fn huge_page(zone: &mut Zone) -> Pfn {
        zone.alloc_pages(9).expect("a free 2M block")
    }

    #[test]
    fn optimizing_frees_what_the_rule_does_not_keep_and_restoring_allocates_it() {
        for (rule, freed, restored) in [(HvoRule::Linux618, 7, 7), (HvoRule::Series2021, 6, 6)] {
            let mut zone = Zone::new(4096);
            let mut v = Vmemmap {
                optimize: true,
                rule,
                ..Vmemmap::default()
            };
            let folio = huge_page(&mut zone);
            let free = zone.nr_free_pages();
            v.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
            assert!(v.is_optimized(folio));
            // 6.18 copies the head page first, then frees all 8 boot pages.
            let copy = u64::from(rule == HvoRule::Linux618);
            assert_eq!(v.nr_memmap_pages, copy as i64, "{rule:?}");
            assert_eq!(v.nr_memmap_boot_pages, -(freed + copy as i64), "{rule:?}");
            assert_eq!(v.nr_memmap_pages + v.nr_memmap_boot_pages, -freed);
            assert_eq!(zone.nr_free_pages(), free - copy);
            assert!(v.hugetlb_vmemmap_restore_folio(&mut zone, folio, 512));
            assert!(!v.is_optimized(folio));
            assert_eq!(v.nr_memmap_pages + v.nr_memmap_boot_pages, 0);
            assert_eq!(zone.nr_free_pages(), free - copy - restored);
            // A second cycle frees the zone frames the first restore took.
            let boot = v.nr_memmap_boot_pages;
            v.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
            assert_eq!(
                v.nr_memmap_boot_pages, boot,
                "{rule:?}: nothing more from boot"
            );
            assert_eq!(v.nr_memmap_pages + v.nr_memmap_boot_pages, -freed);
        }
    }

    #[test]
    fn nothing_is_optimized_with_the_sysctl_off_or_an_odd_struct_page() {
        let mut zone = Zone::new(4096);
        let folio = huge_page(&mut zone);
        let mut off = Vmemmap::default();
        off.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
        assert!(!off.is_optimized(folio));
        let mut odd = Vmemmap {
            optimize: true,
            geometry: VmemmapGeometry {
                struct_page: 56,
                ..VmemmapGeometry::default()
            },
            ..Vmemmap::default()
        };
        odd.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
        assert!(!odd.is_optimized(folio));
        // A 32-byte struct page: 4 vmemmap pages per 2M page, 3 freed.
        let mut small = Vmemmap {
            optimize: true,
            geometry: VmemmapGeometry {
                struct_page: 32,
                ..VmemmapGeometry::default()
            },
            ..Vmemmap::default()
        };
        small.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
        assert_eq!(small.nr_memmap_pages + small.nr_memmap_boot_pages, -3);
    }

    #[test]
    fn a_restore_that_finds_no_memory_changes_nothing() {
        let mut zone = Zone::new(512 + 1);
        let mut v = Vmemmap {
            optimize: true,
            ..Vmemmap::default()
        };
        let folio = huge_page(&mut zone);
        v.hugetlb_vmemmap_optimize_folio(&mut zone, folio, 512);
        assert_eq!(zone.nr_free_pages(), 0, "the head copy took the last frame");
        assert!(!v.hugetlb_vmemmap_restore_folio(&mut zone, folio, 512));
        assert!(v.is_optimized(folio));
        assert_eq!(v.nr_memmap_pages + v.nr_memmap_boot_pages, -7);
    }
}
