//! `struct page` and folios: the per-frame metadata the model keeps (its
//! `page_folio` lookup is in `sparse`, with the memmap it reads), and the
//! fault result type (`vm_fault_t`); and the address
//! space types every mechanism shares: `mm_struct` (`MmStruct`, its
//! `mm_id`), `vm_area_struct` (`Vma`, with its hugetlb fields) and the
//! model's named regions. Their operations live in the files of the kernel
//! code that performs them (`mmap`, `hugetlb`, ...).
//!
//! Follows Linux 6.18 `include/linux/mm_types.h` and `include/linux/page-flags.h`.
//! Simplifications: a page is 8 bytes, not 64 — flags (with the order in the top
//! bits, like `folio->_flags_1`), the per-page PTE mapcount and one 32-bit word
//! whose meaning depends on the page's role, the way the kernel overlays folio
//! fields on the first tail pages:
//!
//! | page            | `private` holds                               |
//! |-----------------|-----------------------------------------------|
//! | folio head      | `_refcount`                                   |
//! | head + 1        | `_entire_mapcount` (PMD mappings)             |
//! | head + 2        | `_nr_pages_mapped` (pages mapped by a PTE)    |
//! | head + 3        | `_pincount`                                   |
//! | free block head | unused (order lives in the flags)             |
//!
//! Anonymous large folios have order >= 2 (THP_ORDERS_ALL_ANON), so heads 1..3
//! always exist. Mapcounts start at 0 meaning "unmapped" (the kernel stores -1).
//!
//! The folio fields that only large folios need and that do not fit in 8
//! bytes — `folio->mapping` (the anon_vma), `folio->index` and
//! `_large_mapcount` — are a `FolioExt` beside the memory map (`sparse`),
//! the way page_ext keeps extra per-page data beside it. Small folios have
//! none: the model never walks the rmap of an order-0 folio (nothing splits
//! it), and its mapcount is its page's.

use crate::pgtable::PmdMap;
use std::collections::BTreeMap;

/// A page frame number, shared with the kernel backend's pagemap readers.
pub use hugelab_workload::units::Pfn;

/// The page sizes every hugelab crate shares (x86_64, 4 KiB pages).
pub use hugelab_workload::units::{
    HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SHIFT, PAGE_SIZE, PMD_SHIFT, PMD_SIZE,
};
/// The range one PMD table maps (one PUD entry): 1 GiB.
pub const PUD_SIZE: u64 = PMD_SIZE << 9;
/// PTEs per page table (see pgtable).
pub use crate::pgtable::PTRS_PER_PTE;
/// MAX_PAGE_ORDER: the largest buddy block is 4 MiB.
pub const MAX_PAGE_ORDER: u32 = 10;
pub const NR_PAGE_ORDERS: usize = MAX_PAGE_ORDER as usize + 1;

/// Page flags, named after `enum pageflags`. The order bits hold the order
/// of a folio head or free block, and on a tail page the order of its folio.
pub mod pg {
    /// Head of a free buddy block (PageBuddy); the block's order is in the page.
    pub const BUDDY: u16 = 1 << 0;
    /// First page of a folio in use (order 0 folios too).
    pub const HEAD: u16 = 1 << 1;
    /// Page of a large folio other than the head.
    pub const TAIL: u16 = 1 << 2;
    /// folio_test_anon.
    pub const ANON: u16 = 1 << 3;
    /// PageAnonExclusive, per page.
    pub const ANON_EXCLUSIVE: u16 = 1 << 4;
    /// The page's content is all zero bytes (what thp_underused inspects).
    pub const ZEROED: u16 = 1 << 5;
    /// Head: the folio is on the deferred split queue.
    pub const DEFERRED: u16 = 1 << 6;
    /// Head: folio_test_partially_mapped.
    pub const PARTIALLY_MAPPED: u16 = 1 << 7;
    /// A page-table page (PageTable).
    pub const PGTABLE: u16 = 1 << 8;
    /// The workload stored to this page (a store of zero bytes counts): not
    /// a kernel flag, hugelab's utilization bookkeeping (`thp_utilization`).
    pub const WRITTEN: u16 = 1 << 9;
    /// Head of a large folio: why it exists (`thp_utilization::FOLIO_CAUSE_*`),
    /// two bits; 0 on order-0 folios and on every other page.
    pub const CAUSE_SHIFT: u32 = 10;
    pub const CAUSE_MASK: u16 = 0b11 << CAUSE_SHIFT;
    /// An order-0 page cache page (`filemap`): PG_dirty. It shares the bit
    /// of `DEFERRED`, which only the heads of large anon folios use.
    pub const DIRTY: u16 = DEFERRED;
    /// Bits 12..16 hold the order of a head or free block.
    pub const ORDER_SHIFT: u32 = 12;
    pub const FLAGS_MASK: u16 = (1 << ORDER_SHIFT) - 1;
}

/// One page frame's metadata (`struct page`, shrunk to 8 bytes; see module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Page {
    flags: u16,
    /// Number of PTEs mapping this page (`page->_mapcount + 1`).
    pub mapcount: u16,
    /// Refcount, entire mapcount, nr_pages_mapped or pincount: see module doc.
    pub private: u32,
}

impl Page {
    #[inline]
    pub fn test(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
    #[inline]
    pub fn set(&mut self, flag: u16) {
        self.flags |= flag;
    }
    #[inline]
    pub fn clear(&mut self, flag: u16) {
        self.flags &= !flag;
    }
    /// Sets `set` and clears `clear` in one update.
    #[inline]
    pub fn set_clear(&mut self, set: u16, clear: u16) {
        self.flags = (self.flags | set) & !clear;
    }
    /// The `pg::CAUSE_MASK` field, shifted down (see `thp_utilization`).
    #[inline]
    pub fn cause_bits(&self) -> u16 {
        (self.flags & pg::CAUSE_MASK) >> pg::CAUSE_SHIFT
    }
    #[inline]
    pub fn set_cause_bits(&mut self, bits: u16) {
        self.flags = (self.flags & !pg::CAUSE_MASK) | ((bits << pg::CAUSE_SHIFT) & pg::CAUSE_MASK);
    }
    /// The head of an order-0 folio in use (PageHead with no order bits).
    #[inline]
    pub fn is_small_folio(&self) -> bool {
        self.flags & (pg::HEAD | pg::BUDDY | !pg::FLAGS_MASK) == pg::HEAD
    }
    #[inline]
    pub fn order(&self) -> u32 {
        u32::from(self.flags >> pg::ORDER_SHIFT)
    }
    /// Resets the page to `flags` with `order` and zero counts.
    #[inline]
    pub fn init(&mut self, flags: u16, order: u32) {
        debug_assert!(order <= MAX_PAGE_ORDER);
        *self = Page {
            flags: (flags & pg::FLAGS_MASK) | ((order as u16) << pg::ORDER_SHIFT),
            mapcount: 0,
            private: 0,
        };
    }
}

/// The large-folio fields kept beside the memory map (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FolioExt {
    /// `folio->mapping` of an anon folio: the anon_vma of the mm it was
    /// faulted (or collapsed, or copied) in, named by that mm's id
    /// (`rmap::AnonVma`).
    pub anon_vma: u32,
    /// `_large_mapcount`: every page-table mapping of the folio, a PMD
    /// counting once (plain count; the kernel stores it minus one).
    pub large_mapcount: u32,
    /// `folio->index` of an anon folio: the page offset of its first page
    /// in the VMA it was faulted (or collapsed) in (`linear_page_index`:
    /// the VMA's `vm_pgoff` plus the page's distance from its start). Each
    /// VMA of its anon_vma tree maps it where that offset falls in it
    /// (`vma_address`), so a folio `mremap` cut in two is found in both
    /// VMAs, the moved one keeping the old range's pgoff.
    pub index: u64,
}

/// Why a fault could not complete (`enum vm_fault_reason`, the model's
/// vm_fault_t for the two outcomes it has).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// VM_FAULT_SIGSEGV: no VMA, or the VMA does not allow the access.
    Sigsegv { addr: u64, write: bool },
    /// VM_FAULT_OOM: not even an order-0 page could be allocated.
    Oom,
    /// VM_FAULT_SIGBUS: the fault cannot be served and the process gets
    /// SIGBUS (a HugeTLB fault when the pool has no page for it:
    /// `alloc_hugetlb_folio` fails with -ENOSPC). The task is killed.
    Sigbus { addr: u64 },
    /// The memcg OOM killer chose the faulting process (SIGKILL): its
    /// charge failed with VM_FAULT_OOM and it dies (memcontrol).
    OomKilled,
}

/// An MM's id (`mm_struct.mm_id`); MM_ID_DUMMY (0) is a free slot.
pub type MmId = u32;
pub const MM_ID_DUMMY: MmId = 0;

/// A virtual memory area (`struct vm_area_struct`), `[start, end)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Vma {
    pub start: u64,
    pub end: u64,
    pub flags: u32,
    /// `vm_pgoff`, in pages: for an anonymous VMA its start address >>
    /// PAGE_SHIFT when mapped (do_mmap), following its start through splits;
    /// `mremap` moves a VMA with its pgoff (`copy_vma`), and VMAs merge only
    /// when their pgoffs are continuous (`can_vma_merge_after`/`_before`).
    pub pgoff: u64,
    /// The VMA has an anon_vma (anon_vma_prepare ran: a write fault, a PMD
    /// fault, or fork from a VMA that had one). fork copies the page tables
    /// of such VMAs only.
    pub anon_vma: bool,
    /// Which anon_vma of its mm it has (meaningful with `anon_vma`): a split
    /// copies it, so the two parts of a VMA a hole was punched in share
    /// one, and a mapping that fills the hole merges all three
    /// (`vma_merge_new_range`: `is_mergeable_anon_vma(prev, next)`).
    pub anon_vma_id: u32,
    /// The VMA was copied by fork from a VMA with an anon_vma, so its
    /// anon_vma_chain links its parent's anon_vma too
    /// (`vma_had_uncowed_parents` in mm/vma.c): such a VMA takes in no new
    /// neighbour at mmap (`is_mergeable_anon_vma`).
    pub fork_child: bool,
    /// A HugeTLB mapping (VM_HUGETLB): its file, offset and reservation
    /// state (see `hugetlb`).
    pub hugetlb: Option<HugetlbVma>,
    /// A private mapping of a file of the workload (`vm_file`, `vm_pgoff`;
    /// see `filemap`); None for anonymous memory.
    pub file: Option<FileVma>,
}

impl Vma {
    pub const VM_READ: u32 = 1 << 0;
    pub const VM_WRITE: u32 = 1 << 1;
    pub const VM_HUGEPAGE: u32 = 1 << 2;
    pub const VM_NOHUGEPAGE: u32 = 1 << 3;
    /// MAP_GROWSDOWN: a stack that a fault below it grows (expand_downwards).
    pub const VM_GROWSDOWN: u32 = 1 << 4;
    /// A private writable mapping's memory counted in the commit charge
    /// (`accountable_mapping`); it keeps a VMA from merging with one
    /// without it, as any flag does. mprotect to read-only keeps it, but
    /// on an anonymous VMA with no anon_vma yet (`mprotect_fixup`).
    pub const VM_ACCOUNT: u32 = 1 << 5;
    /// PROT_EXEC (calc_vm_prot_bits). Nothing the model runs looks at it
    /// but VMA merging, which it keeps apart as any flag does: the
    /// workload's files are memfds, whose THP eligibility does not depend
    /// on it in 6.18 (`file_thp_enabled`), and the page protection it
    /// changes (x86's NX bit, `vm_get_page_prot`) changes no fault.
    pub const VM_EXEC: u32 = 1 << 6;
    pub const PROT_MASK: u32 = Self::VM_READ | Self::VM_WRITE | Self::VM_EXEC;

    /// vma_pages.
    pub fn pages(&self) -> u64 {
        (self.end - self.start) >> PAGE_SHIFT
    }

    /// linear_page_index: the page offset `addr` has in this VMA.
    pub fn linear_page_index(&self, addr: u64) -> u64 {
        self.pgoff + ((addr - self.start) >> PAGE_SHIFT)
    }

    /// Whether the VMA's protection allows a user read, or a write, to
    /// fault in (else the access is SIGSEGV): x86's `access_error` lets a
    /// read of a page not present through on any accessible VMA
    /// (`vma_is_accessible`: VM_READ, VM_WRITE or VM_EXEC). With protection
    /// keys (`pkeys`), mmap or mprotect of PROT_EXEC alone gives the VMA
    /// the mm's execute-only key (arch/x86/mm/pkeys.c
    /// `__arch_override_mprotect_pkey`), whose PKRU bits disable access: a
    /// read of an exec-only VMA is then a protection-key fault, SIGSEGV.
    /// Simplified: the key is derived from the flags (exec-only ⇔ the key),
    /// which holds while the mm has a key free for it, as workloads do.
    pub fn allows(&self, write: bool, pkeys: bool) -> bool {
        if write {
            return self.flags & Self::VM_WRITE != 0;
        }
        let prot = self.flags & Self::PROT_MASK;
        prot != 0 && !(pkeys && prot == Self::VM_EXEC)
    }

    /// Whether GUP without FOLL_FORCE may read, or write, the VMA
    /// (`check_vma_flags` in mm/gup.c): a read needs VM_READ.
    pub fn gup_allows(&self, write: bool) -> bool {
        let need = if write { Self::VM_WRITE } else { Self::VM_READ };
        self.flags & need != 0
    }
}

/// A named region of a process: where `mmap` put it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub start: u64,
    pub len: u64,
}

/// `struct mm_struct`: VMAs, page tables and the per-mm THP state.
#[derive(Default)]
pub struct MmStruct {
    /// VMAs by start address.
    pub vmas: BTreeMap<u64, Vma>,
    /// anon_vmas made for its VMAs so far: the next one's identity.
    pub anon_vmas_made: u32,
    /// PMD entries by PMD index (address / 2 MiB); absent means pmd_none.
    pub pmds: PmdMap,
    pub regions: BTreeMap<String, Region>,
    /// The growsdown stack regions, with what of each `munmap` left: a
    /// stack's region is gone when munmaps have covered all of it (the
    /// part it never grew into too), as the checker and the kernel backend
    /// count it, not when no VMA is left in it.
    pub stack_regions: BTreeMap<String, hugelab_workload::mapped::Mapped>,
    /// MMF_DISABLE_THP_COMPLETELY (prctl PR_SET_THP_DISABLE).
    pub thp_disabled: bool,
    /// MMF_HUGE_ZERO_FOLIO: this mm holds a reference on the huge zero folio.
    pub huge_zero_ref: bool,
    /// On khugepaged's mm list (MMF_VM_HUGEPAGE).
    pub khugepaged_registered: bool,
    /// MM_ANONPAGES, in pages.
    pub anon_rss: u64,
    /// `mm_struct.mm_id`, which the MM-ID slots of large folios record.
    pub mm_id: MmId,
    /// MMF_HAS_PINNED: this mm has ever pinned pages (fork then copies
    /// pinned exclusive pages instead of sharing them).
    pub has_pinned: bool,
    /// The PMD tables (one per 1 GiB) and PUD tables (one per 512 GiB) the
    /// regions' faults allocated (__pmd_alloc, __pud_alloc), by index. They
    /// count in NR_PAGETABLE like PTE tables and live until free_pgtables
    /// finds no VMA left in their range.
    pub pmd_tables: BTreeMap<u64, Pfn>,
    pub pud_tables: BTreeMap<u64, Pfn>,
    /// The huge PTEs of HugeTLB VMAs (PMD entries for 2 MiB pages, PUD
    /// entries for 1 GiB pages), by address.
    pub hugetlb_ptes: BTreeMap<u64, HugePte>,
    /// The pages of each special mapping (`SPECIAL_MAPPINGS`, in order:
    /// vdso, vvar, vvar_vclock) the mm has a PTE for, bit i page i (see
    /// [`crate::special_mapping`]).
    pub special_ptes: [u64; 3],
    pub(crate) mmap_cursor: u64,
}

impl MmStruct {
    /// A new, empty address space with this id.
    pub fn new(mm_id: MmId) -> Self {
        MmStruct {
            mm_id,
            ..MmStruct::default()
        }
    }

    /// anon_vma_prepare for the VMA at `addr`.
    pub fn anon_vma_prepare(&mut self, addr: u64) {
        if let Some((_, vma)) = self.vmas.range_mut(..=addr).next_back() {
            if vma.end > addr && !vma.anon_vma {
                self.anon_vmas_made += 1;
                vma.anon_vma = true;
                vma.anon_vma_id = self.anon_vmas_made;
            }
        }
    }

    /// find_vma that contains `addr`.
    pub fn find_vma(&self, addr: u64) -> Option<Vma> {
        let (_, vma) = self.vmas.range(..=addr).next_back()?;
        (vma.end > addr).then_some(*vma)
    }

    /// The VMAs overlapping `[start, end)`, in address order.
    pub fn vmas_in(&self, start: u64, end: u64) -> Vec<Vma> {
        let first = self.find_vma(start).map_or(start, |v| v.start);
        self.vmas.range(first..end).map(|(_, v)| *v).collect()
    }
}

/// A file VMA's file and offset (`vm_file`, `vm_pgoff`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVma {
    /// The file's inode (`PageCache::inode`).
    pub inode: u32,
    /// vm_pgoff: the file page the VMA's first page maps.
    pub pgoff: u64,
    /// VM_SHARED: a shared anonymous mapping, whose file is the shmem
    /// object `shmem_zero_setup` made for it; false for a MAP_PRIVATE
    /// mapping of a workload file.
    pub shared: bool,
}

impl FileVma {
    /// The same file, for the part of `vma` that starts at `addr`.
    pub fn at(&self, vma: &Vma, addr: u64) -> FileVma {
        FileVma {
            pgoff: self.pgoff + ((addr - vma.start) >> PAGE_SHIFT),
            ..*self
        }
    }

    /// linear_page_index: the file page `addr` of `vma` maps.
    pub fn linear_page_index(&self, vma: &Vma, addr: u64) -> u64 {
        self.pgoff + ((addr - vma.start) >> PAGE_SHIFT)
    }
}

/// An index into `hugetlb::HSTATE_ORDERS` (a `struct hstate`).
pub type HstateIdx = usize;

/// A HugeTLB VMA's hugetlb fields: its file, offset and private data
/// (`vm_file`, `vm_pgoff`, `vm_private_data`; see `hugetlb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugetlbVma {
    pub hstate: HstateIdx,
    pub inode: u32,
    /// vm_pgoff, in huge pages.
    pub pgoff: u64,
    /// VM_MAYSHARE.
    pub shared: bool,
    /// A private mapping's reserve map (the owner's only).
    pub(crate) resv: Option<u32>,
    /// HPAGE_RESV_OWNER.
    pub(crate) owner: bool,
    /// HPAGE_RESV_UNMAPPED: `unmap_ref_private` took a page from it.
    pub(crate) unmapped: bool,
}

/// A present huge PTE (PMD or PUD entry) of a HugeTLB mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePte {
    pub folio: Pfn,
    pub writable: bool,
}

/// Whether `[start, end)` of `mm` touches a HugeTLB VMA
/// (`is_vm_hugetlb_page`, include/linux/hugetlb_inline.h, over a range).
pub fn range_has_hugetlb(mm: &MmStruct, start: u64, end: u64) -> bool {
    mm.vmas_in(start, end).iter().any(|v| v.hugetlb.is_some())
}
