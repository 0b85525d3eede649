//! HugeTLB pages: the hstates and their pools, reservations, faults,
//! copy-on-write, fork and unmap of `mmap ... hugetlb=` regions.
//!
//! Follows Linux 6.18 `mm/hugetlb.c`:
//! - pools: `set_max_huge_pages` (surplus pages first become persistent,
//!   then fresh pages come from the buddy allocator, `alloc_pool_huge_folio`;
//!   shrinking frees free pages beyond the reservations,
//!   `remove_pool_hugetlb_folio`, and makes pages in use surplus,
//!   `adjust_pool_surplus`), `alloc_surplus_hugetlb_folio` (up to
//!   `nr_overcommit_hugepages`, never for gigantic pages), `free_huge_folio`
//!   (a freed page returns to the pool, or to the buddy allocator while the
//!   hstate has surplus pages). Free pages are a LIFO list
//!   (`enqueue_hugetlb_folio` adds at the head, dequeue takes the head);
//! - reservations: `hugetlb_reserve_pages` at mmap reserves every huge page
//!   of the mapping (`gather_surplus_pages` adds surplus pages when the free
//!   ones do not cover `resv_huge_pages`; mmap fails with ENOMEM when it
//!   cannot). A private mapping's reserve map records the pages whose
//!   reservation was *consumed* (the opposite of a shared one's, which is
//!   the file's), and only the process that made the mapping owns it
//!   (HPAGE_RESV_OWNER): `hugetlb_dup_vma_private` leaves a child none, so a
//!   child's faults take unreserved pages or fail. `hugetlb_vm_op_close`
//!   returns a private mapping's unconsumed reservations,
//!   `hugetlb_unreserve_pages` a shared file's when its last mapping goes;
//! - faults: `hugetlb_no_page` (a private mapping gets a zeroed page of its
//!   own, a shared one the file's page, allocated on first use),
//!   `hugetlb_wp` (reuse when the page is mapped once; otherwise copy; when
//!   the owner of a private mapping finds no page for the copy,
//!   `unmap_ref_private` takes the page from the children, which get
//!   SIGBUS at their next fault in the mapping; a child that finds none gets
//!   SIGBUS at once), `alloc_hugetlb_folio`;
//! - fork: `copy_hugetlb_page_range` shares a private mapping's pages
//!   write-protected in both; a shared mapping's are faulted afresh;
//! - unmap: `__unmap_hugepage_range`, which gives the owner's reservation
//!   back for a page it unmaps while no surplus pages exist (restore_reserve),
//!   and munmap's `hugetlb_vm_op_split`, which refuses to cut a mapping
//!   anywhere but on a huge page boundary (EINVAL).
//!
//! HugeTLB page state lives beside the memory map (`HugetlbFolio`), not in
//! the 8-byte `Page`: a gigantic page's order does not fit its order bits.
//! Page tables: a 2 MiB page is a PMD entry (its PUD and PMD tables are
//! allocated as for anonymous memory), a 1 GiB page a PUD entry (a PUD table
//! only); entries are kept per mm by address (`MmStruct::hugetlb_ptes`).
//!
//! Simplifications: one node; no subpools (hugetlbfs mount limits), no
//! hugetlb cgroup, no MAP_NORESERVE, no userfaultfd, no PMD sharing (a
//! shared 2 MiB mapping of 1 GiB or more is refused), no madvise, mprotect,
//! pins or debugfs split on HugeTLB memory (refused); the workqueue that
//! frees an optimized surplus page (`free_hpage_work`) runs at once.

use crate::mm_types::{
    Fault, HstateIdx, HugePte, HugetlbVma, MmStruct, Pfn, Vma, PAGE_SIZE, PUD_SIZE,
};
use crate::vmstat::VmEvent;
use crate::Machine;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The hstates, default (2 MiB) first: their orders.
pub const HSTATE_ORDERS: [u32; 2] = [9, 18];
pub const NR_HSTATES: usize = HSTATE_ORDERS.len();

/// The hstate of HugeTLB pages of `bytes`, if there is one.
pub fn size_to_hstate(bytes: u64) -> Option<HstateIdx> {
    HSTATE_ORDERS.iter().position(|&o| PAGE_SIZE << o == bytes)
}

pub fn huge_page_size(h: HstateIdx) -> u64 {
    PAGE_SIZE << HSTATE_ORDERS[h]
}

pub fn pages_per_huge_page(h: HstateIdx) -> u64 {
    1 << HSTATE_ORDERS[h]
}

/// hstate_is_gigantic: larger than the buddy allocator's largest block.
pub fn hstate_is_gigantic(h: HstateIdx) -> bool {
    HSTATE_ORDERS[h] > crate::mm_types::MAX_PAGE_ORDER
}

/// `struct hstate`: one pool.
#[derive(Default)]
pub struct Hstate {
    pub nr_huge_pages: u64,
    pub free_huge_pages: u64,
    /// `resv_huge_pages`, an unsigned long the kernel lets wrap below zero
    /// (a private mapping's owner unmapping a page its child still maps
    /// gives the reservation back twice until the child lets go): signed
    /// here, and read as the negative number it stands for.
    pub resv_huge_pages: i64,
    pub surplus_huge_pages: u64,
    pub nr_overcommit_huge_pages: u64,
    pub max_huge_pages: u64,
    /// hugepage_freelists; the last entry is the list's head.
    freelist: Vec<Pfn>,
}

impl Hstate {
    fn persistent_huge_pages(&self) -> u64 {
        self.nr_huge_pages - self.surplus_huge_pages
    }

    /// `free - resv` as the kernel's unsigned long: when the reservations
    /// wrapped below zero or exceed the free pages it is not 0, and a page
    /// is dequeued anyway.
    fn available_huge_pages(&self) -> u64 {
        (self.free_huge_pages as i64 - self.resv_huge_pages) as u64
    }
}

/// A HugeTLB folio (head pfn in `Hugetlb::folios`).
#[derive(Clone, Copy, Debug)]
pub struct HugetlbFolio {
    pub hstate: HstateIdx,
    /// Page-table mappings (`folio_mapcount`).
    pub mapcount: u32,
    /// In a shared file's page cache: its reference.
    pub in_page_cache: bool,
    /// folio_test_anon: a private mapping's page.
    pub anon: bool,
    /// folio_test_hugetlb_restore_reserve.
    pub restore_reserve: bool,
    /// On the free list.
    pub free: bool,
}

impl HugetlbFolio {
    fn refcount(&self) -> u32 {
        self.mapcount + u32::from(self.in_page_cache)
    }
}

/// The anonymous hugetlbfs file behind a mapping (`hugetlb_file_setup`).
pub struct Inode {
    pub hstate: HstateIdx,
    /// A shared file's reserve map: reserved or instantiated pages.
    resv: Vec<bool>,
    /// A shared file's page cache, by huge page index.
    cache: BTreeMap<u64, Pfn>,
    /// VMAs that map the file (their `vm_file` references).
    vmas: u32,
}

/// A private mapping's reserve map: pages whose reservation was consumed.
struct ResvMap {
    consumed: Vec<bool>,
    refs: u32,
}

impl HugetlbVma {
    /// vma_hugecache_offset: the file index of the huge page at `addr`.
    fn index(&self, vma: &Vma, addr: u64) -> u64 {
        (addr - vma.start) / huge_page_size(self.hstate) + self.pgoff
    }

    /// The VMA after `__split_vma` moved its start to `start`.
    pub fn at(self, vma: &Vma, start: u64) -> HugetlbVma {
        HugetlbVma {
            pgoff: self.index(vma, start),
            ..self
        }
    }
}

/// The machine's HugeTLB state.
#[derive(Default)]
pub struct Hugetlb {
    pub hstates: [Hstate; NR_HSTATES],
    pub folios: HashMap<Pfn, HugetlbFolio>,
    inodes: HashMap<u32, Inode>,
    resv_maps: HashMap<u32, ResvMap>,
    last_id: u32,
}

impl Hugetlb {
    fn next_id(&mut self) -> u32 {
        self.last_id += 1;
        self.last_id
    }

    /// Frames held by HugeTLB pages (for debug_vm's frame accounting).
    pub fn frames(&self) -> u64 {
        self.folios
            .values()
            .map(|f| pages_per_huge_page(f.hstate))
            .sum()
    }

    /// `Hugetlb:` in /proc/meminfo, in kB: every pool's pages.
    pub fn meminfo_hugetlb_kb(&self) -> i64 {
        (0..NR_HSTATES)
            .map(|h| ((self.hstates[h].nr_huge_pages * huge_page_size(h)) >> 10) as i64)
            .sum()
    }
}

/// alloc_fresh_hugetlb_folio: a page from the buddy allocator (a contiguous
/// range for a gigantic page), optimized by HVO if the sysctl is on. Not
/// yet counted in the hstate.
/// Pool growth allocates its pages first and optimizes them as a batch
/// (`prep_and_add_allocated_folios`): `optimize` false leaves that to the
/// caller.
fn alloc_fresh_hugetlb_folio(m: &mut Machine, h: HstateIdx, optimize: bool) -> Option<Pfn> {
    let order = HSTATE_ORDERS[h];
    let pfn = if hstate_is_gigantic(h) {
        m.zone.alloc_contig_pages(order)?
    } else {
        m.zone.alloc_pages(order)?
    };
    if optimize {
        m.vmemmap
            .hugetlb_vmemmap_optimize_folio(&mut m.zone, pfn, pages_per_huge_page(h));
    }
    m.hugetlb.folios.insert(
        pfn,
        HugetlbFolio {
            hstate: h,
            mapcount: 0,
            in_page_cache: false,
            anon: false,
            restore_reserve: false,
            free: false,
        },
    );
    Some(pfn)
}

/// update_and_free_hugetlb_folio: the vmemmap back, then the frames to the
/// buddy allocator. When the vmemmap cannot be allocated the page stays in
/// the pool as a surplus page, as `bulk_vmemmap_restore_error` keeps it;
/// false then.
fn update_and_free_hugetlb_folio(m: &mut Machine, folio: Pfn) -> bool {
    let h = m.hugetlb.folios[&folio].hstate;
    let nr = pages_per_huge_page(h);
    if !m
        .vmemmap
        .hugetlb_vmemmap_restore_folio(&mut m.zone, folio, nr)
    {
        let hs = &mut m.hugetlb.hstates[h];
        hs.nr_huge_pages += 1;
        hs.surplus_huge_pages += 1;
        enqueue_hugetlb_folio(m, folio);
        return false;
    }
    m.hugetlb.folios.remove(&folio);
    m.zone.free_pages_run(folio, nr);
    true
}

/// update_and_free_pages_bulk: the vmemmap of every page back first
/// (`hugetlb_vmemmap_restore_folios`), then the pages to the buddy
/// allocator; a page whose vmemmap cannot come back even after the others
/// were freed stays as a surplus page.
fn update_and_free_pages_bulk(m: &mut Machine, folios: Vec<Pfn>) {
    let mut failed = Vec::new();
    let mut restored = Vec::new();
    for folio in folios {
        let nr = pages_per_huge_page(m.hugetlb.folios[&folio].hstate);
        if m.vmemmap
            .hugetlb_vmemmap_restore_folio(&mut m.zone, folio, nr)
        {
            restored.push(folio);
        } else {
            failed.push(folio);
        }
    }
    for folio in restored.into_iter().chain(failed) {
        update_and_free_hugetlb_folio(m, folio);
    }
}

fn enqueue_hugetlb_folio(m: &mut Machine, folio: Pfn) {
    let f = m.hugetlb.folios.get_mut(&folio).expect("a hugetlb folio");
    f.free = true;
    f.anon = false;
    let hs = &mut m.hugetlb.hstates[f.hstate];
    hs.freelist.push(folio);
    hs.free_huge_pages += 1;
}

/// dequeue_hugetlb_folio_nodemask: the head of the free list.
fn dequeue_hugetlb_folio(m: &mut Machine, h: HstateIdx) -> Option<Pfn> {
    let hs = &mut m.hugetlb.hstates[h];
    let folio = hs.freelist.pop()?;
    hs.free_huge_pages -= 1;
    m.hugetlb.folios.get_mut(&folio).expect("free folio").free = false;
    Some(folio)
}

/// remove_pool_hugetlb_folio: a free page leaves the pool (and the surplus
/// count with it when `acct_surplus`).
fn remove_pool_hugetlb_folio(m: &mut Machine, h: HstateIdx, acct_surplus: bool) -> Option<Pfn> {
    let folio = dequeue_hugetlb_folio(m, h)?;
    let hs = &mut m.hugetlb.hstates[h];
    hs.nr_huge_pages -= 1;
    if acct_surplus && hs.surplus_huge_pages > 0 {
        hs.surplus_huge_pages -= 1;
    }
    Some(folio)
}

/// set_max_huge_pages: writing `nr_hugepages`.
pub fn set_max_huge_pages(m: &mut Machine, h: HstateIdx, count: u64) {
    {
        let hs = &mut m.hugetlb.hstates[h];
        while hs.surplus_huge_pages > 0 && count > hs.persistent_huge_pages() {
            hs.surplus_huge_pages -= 1;
        }
    }
    // Fresh pages, optimized as a batch and then added to the pool.
    let mut allocated = Vec::new();
    while count > m.hugetlb.hstates[h].persistent_huge_pages() + allocated.len() as u64 {
        match alloc_fresh_hugetlb_folio(m, h, false) {
            Some(folio) => allocated.push(folio),
            None => break,
        }
    }
    for &folio in &allocated {
        m.vmemmap
            .hugetlb_vmemmap_optimize_folio(&mut m.zone, folio, pages_per_huge_page(h));
    }
    for folio in allocated {
        m.hugetlb.hstates[h].nr_huge_pages += 1;
        enqueue_hugetlb_folio(m, folio);
    }
    let hs = &m.hugetlb.hstates[h];
    let mut persistent_free = hs.free_huge_pages;
    if hs.free_huge_pages > hs.persistent_huge_pages() {
        persistent_free = hs.free_huge_pages.saturating_sub(hs.surplus_huge_pages);
    }
    // Unsigned arithmetic, as the kernel's: a sum that wraps below zero
    // (reservations gone negative) is huge, and no page is freed.
    let min_count = ((hs.resv_huge_pages + hs.persistent_huge_pages() as i64
        - persistent_free as i64) as u64)
        .max(count);
    let mut freed = Vec::new();
    while min_count < m.hugetlb.hstates[h].persistent_huge_pages() {
        match remove_pool_hugetlb_folio(m, h, false) {
            Some(folio) => freed.push(folio),
            None => break,
        }
    }
    update_and_free_pages_bulk(m, freed);
    let hs = &mut m.hugetlb.hstates[h];
    while count < hs.persistent_huge_pages() && hs.surplus_huge_pages < hs.nr_huge_pages {
        hs.surplus_huge_pages += 1;
    }
    hs.max_huge_pages = hs.persistent_huge_pages();
}

/// alloc_surplus_hugetlb_folio: a page beyond the pool, up to
/// nr_overcommit_hugepages; never a gigantic one.
fn alloc_surplus_hugetlb_folio(m: &mut Machine, h: HstateIdx) -> Option<Pfn> {
    let hs = &m.hugetlb.hstates[h];
    if hstate_is_gigantic(h) || hs.surplus_huge_pages >= hs.nr_overcommit_huge_pages {
        return None;
    }
    let folio = alloc_fresh_hugetlb_folio(m, h, true)?;
    let hs = &mut m.hugetlb.hstates[h];
    hs.nr_huge_pages += 1;
    hs.surplus_huge_pages += 1;
    Some(folio)
}

/// return_unused_surplus_pages: `unused` reservations go, and as many free
/// surplus pages with them.
fn return_unused_surplus_pages(m: &mut Machine, h: HstateIdx, unused: u64) {
    let hs = &mut m.hugetlb.hstates[h];
    hs.resv_huge_pages -= unused as i64;
    let nr = unused.min(hs.surplus_huge_pages);
    let mut freed = Vec::new();
    for _ in 0..nr {
        match remove_pool_hugetlb_folio(m, h, true) {
            Some(folio) => freed.push(folio),
            None => break,
        }
    }
    update_and_free_pages_bulk(m, freed);
}

/// gather_surplus_pages: makes the free pages cover `resv_huge_pages +
/// delta` with surplus pages if needed, and reserves; false (nothing
/// changed) when it cannot.
fn gather_surplus_pages(m: &mut Machine, h: HstateIdx, delta: u64) -> bool {
    let hs = &m.hugetlb.hstates[h];
    let needed = hs.resv_huge_pages + delta as i64 - hs.free_huge_pages as i64;
    if needed <= 0 {
        m.hugetlb.hstates[h].resv_huge_pages += delta as i64;
        return true;
    }
    let mut surplus = Vec::new();
    for _ in 0..needed {
        match alloc_surplus_hugetlb_folio(m, h) {
            Some(folio) => surplus.push(folio),
            None => break,
        }
    }
    if (surplus.len() as i64) < needed {
        for folio in surplus {
            free_huge_folio(m, folio);
        }
        return false;
    }
    m.hugetlb.hstates[h].resv_huge_pages += delta as i64;
    for folio in surplus {
        enqueue_hugetlb_folio(m, folio);
    }
    true
}

/// hugetlb_acct_memory for a positive `delta`: reserve or fail.
fn hugetlb_acct_memory(m: &mut Machine, h: HstateIdx, delta: u64) -> bool {
    if delta == 0 {
        return true;
    }
    if !gather_surplus_pages(m, h, delta) {
        return false;
    }
    // allowed_mems_nr: the free pages of the allowed nodes (one node here).
    if delta > m.hugetlb.hstates[h].free_huge_pages {
        return_unused_surplus_pages(m, h, delta);
        return false;
    }
    true
}

/// free_huge_folio: the last reference went.
fn free_huge_folio(m: &mut Machine, folio: Pfn) {
    let f = m.hugetlb.folios.get_mut(&folio).expect("a hugetlb folio");
    let h = f.hstate;
    let restore = std::mem::take(&mut f.restore_reserve);
    f.anon = false;
    let hs = &mut m.hugetlb.hstates[h];
    if restore {
        hs.resv_huge_pages += 1;
    }
    if hs.surplus_huge_pages > 0 {
        hs.nr_huge_pages -= 1;
        hs.surplus_huge_pages -= 1;
        update_and_free_hugetlb_folio(m, folio);
    } else {
        enqueue_hugetlb_folio(m, folio);
    }
}

fn folio_put(m: &mut Machine, folio: Pfn) {
    if m.hugetlb.folios[&folio].refcount() == 0 {
        free_huge_folio(m, folio);
    }
}

/// Why a HugeTLB mmap failed.
#[derive(Debug)]
pub enum MmapError {
    /// The reservation could not be made (ENOMEM).
    NoMem,
}

/// mmap of a HugeTLB region: `hugetlb_file_setup` and `hugetlbfs_file_mmap`
/// with `hugetlb_reserve_pages`. Returns the VMA's hugetlb fields.
///
/// No one kernel function: hugetlb_file_setup then hugetlbfs_file_mmap, which a MAP_HUGETLB mmap calls in turn.
pub fn hugetlb_mmap(
    m: &mut Machine,
    h: HstateIdx,
    len: u64,
    shared: bool,
) -> Result<HugetlbVma, MmapError> {
    let nr = len / huge_page_size(h);
    let inode = m.hugetlb.next_id();
    let resv = if shared {
        None
    } else {
        Some(m.hugetlb.next_id())
    };
    if !hugetlb_acct_memory(m, h, nr) {
        return Err(MmapError::NoMem);
    }
    m.hugetlb.inodes.insert(
        inode,
        Inode {
            hstate: h,
            resv: vec![shared; nr as usize],
            cache: BTreeMap::new(),
            vmas: 1,
        },
    );
    if let Some(id) = resv {
        m.hugetlb.resv_maps.insert(
            id,
            ResvMap {
                consumed: vec![false; nr as usize],
                refs: 1,
            },
        );
    }
    Ok(HugetlbVma {
        hstate: h,
        inode,
        pgoff: 0,
        shared,
        resv,
        owner: !shared,
        unmapped: false,
    })
}

/// hugetlb_vm_op_open for a VMA made by a split (or fork's copy, after
/// `hugetlb_dup_vma_private`): one more reference on the file and on the
/// reserve map.
pub fn hugetlb_vm_op_open(m: &mut Machine, hv: &HugetlbVma) {
    if let Some(inode) = m.hugetlb.inodes.get_mut(&hv.inode) {
        inode.vmas += 1;
    }
    if let (Some(id), true) = (hv.resv, hv.owner) {
        m.hugetlb.resv_maps.get_mut(&id).expect("resv map").refs += 1;
    }
}

/// hugetlb_dup_vma_private: a child's copy of a mapping owns no reservation.
pub fn hugetlb_dup_vma_private(hv: HugetlbVma) -> HugetlbVma {
    HugetlbVma {
        resv: None,
        owner: false,
        unmapped: false,
        ..hv
    }
}

/// hugetlb_vm_op_close, then the file reference (fput): the owner's
/// unconsumed reservations of the VMA go back; when the file's last mapping
/// goes, its pages and reservations go too (hugetlbfs_evict_inode,
/// remove_inode_hugepages, hugetlb_unreserve_pages).
pub fn hugetlb_vm_op_close(m: &mut Machine, vma: &Vma, hv: &HugetlbVma) {
    let h = hv.hstate;
    if let (Some(id), true) = (hv.resv, hv.owner) {
        let start = hv.pgoff;
        let end = hv.index(vma, vma.end);
        let map = m.hugetlb.resv_maps.get_mut(&id).expect("resv map");
        let consumed = map.consumed[start as usize..end as usize]
            .iter()
            .filter(|&&c| c)
            .count() as u64;
        map.refs -= 1;
        if map.refs == 0 {
            m.hugetlb.resv_maps.remove(&id);
        }
        let reserve = (end - start) - consumed;
        if reserve > 0 {
            return_unused_surplus_pages(m, h, reserve);
        }
    }
    let inode = m.hugetlb.inodes.get_mut(&hv.inode).expect("inode");
    inode.vmas -= 1;
    if inode.vmas > 0 {
        return;
    }
    let inode = m.hugetlb.inodes.remove(&hv.inode).expect("inode");
    let mut freed = 0u64;
    for folio in inode.cache.values() {
        let f = m.hugetlb.folios.get_mut(folio).expect("cached folio");
        f.in_page_cache = false;
        freed += 1;
        folio_put(m, *folio);
    }
    let chg = inode.resv.iter().filter(|&&r| r).count() as u64;
    let unused = chg - freed;
    if unused > 0 {
        return_unused_surplus_pages(m, h, unused);
    }
}

/// hugetlb_vm_op_split: a HugeTLB VMA splits only on a huge page boundary.
pub fn hugetlb_vm_op_split(hv: &HugetlbVma, addr: u64) -> bool {
    addr.is_multiple_of(huge_page_size(hv.hstate))
}

/// vma_needs_reservation: whether a fault at `addr` has no reservation.
fn vma_needs_reservation(m: &Machine, vma: &Vma, hv: &HugetlbVma, addr: u64) -> bool {
    let idx = hv.index(vma, addr) as usize;
    if hv.shared {
        return !m.hugetlb.inodes[&hv.inode].resv[idx];
    }
    match (hv.resv, hv.owner) {
        (Some(id), true) => m.hugetlb.resv_maps[&id].consumed[idx],
        _ => true,
    }
}

/// alloc_hugetlb_folio: a page for a fault at `addr`, from the reservation
/// or the free pages beyond the reserved ones, else a surplus page; None is
/// -ENOSPC.
fn alloc_hugetlb_folio(
    m: &mut Machine,
    vma: &Vma,
    hv: &HugetlbVma,
    addr: u64,
    cow_from_owner: bool,
) -> Option<Pfn> {
    let h = hv.hstate;
    // MAP_CHG_ENFORCED for a CoW by the owner: its reservation here was
    // consumed by the page being copied.
    let map_chg = cow_from_owner || vma_needs_reservation(m, vma, hv, addr);
    let gbl_chg = map_chg;
    let available = m.hugetlb.hstates[h].available_huge_pages() != 0;
    let folio = if gbl_chg && !available {
        None
    } else {
        dequeue_hugetlb_folio(m, h)
    };
    let folio = match folio {
        Some(f) => f,
        None => alloc_surplus_hugetlb_folio(m, h)?,
    };
    if !gbl_chg {
        m.hugetlb
            .folios
            .get_mut(&folio)
            .expect("folio")
            .restore_reserve = true;
        m.hugetlb.hstates[h].resv_huge_pages -= 1;
    }
    if !cow_from_owner {
        // vma_commit_reservation.
        let idx = hv.index(vma, addr) as usize;
        if hv.shared {
            m.hugetlb.inodes.get_mut(&hv.inode).expect("inode").resv[idx] = true;
        } else if let (Some(id), true) = (hv.resv, hv.owner) {
            m.hugetlb.resv_maps.get_mut(&id).expect("resv map").consumed[idx] = true;
        }
    }
    Some(folio)
}

/// huge_pte_alloc: the page tables above a huge PTE at `addr` (the PUD
/// table, and for 2 MiB pages the PMD table).
fn huge_pte_alloc(
    m: &mut Machine,
    mm: &mut MmStruct,
    h: HstateIdx,
    addr: u64,
) -> Result<(), Fault> {
    let levels: &[u64] = if hstate_is_gigantic(h) {
        &[PUD_SIZE << 9]
    } else {
        &[PUD_SIZE << 9, PUD_SIZE]
    };
    for &size in levels {
        let tables = if size == PUD_SIZE {
            &mut mm.pmd_tables
        } else {
            &mut mm.pud_tables
        };
        if !tables.contains_key(&(addr / size)) {
            let pfn = m.pte_alloc_one()?;
            let tables = if size == PUD_SIZE {
                &mut mm.pmd_tables
            } else {
                &mut mm.pud_tables
            };
            tables.insert(addr / size, pfn);
        }
    }
    Ok(())
}

/// The VMA's hugetlb fields (the caller found it is a HugeTLB VMA).
fn hv_of(vma: &Vma) -> HugetlbVma {
    vma.hugetlb.expect("a HugeTLB VMA")
}

/// hugetlb_fault for one access at `addr` that needs a fault: the page is
/// not mapped, or mapped read-only for a write; `mm` is taken out of the
/// machine's table, whose other mms unmap_ref_private reaches. Counts
/// PGFAULT.
pub fn hugetlb_fault(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    m.stat.count_vm_event(VmEvent::PgFault);
    let hv = hv_of(vma);
    let haddr = addr & !(huge_page_size(hv.hstate) - 1);
    match mm.hugetlb_ptes.get(&haddr).copied() {
        None => hugetlb_no_page(m, mm, vma, haddr, write),
        Some(_) => hugetlb_wp(m, mm, vma, haddr),
    }
}

/// hugetlb_no_page.
fn hugetlb_no_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    haddr: u64,
    write: bool,
) -> Result<(), Fault> {
    let hv = hv_of(vma);
    if hv.unmapped {
        // "PID %d killed due to inadequate hugepage pool"
        return Err(Fault::Sigbus { addr: haddr });
    }
    let idx = hv.index(vma, haddr);
    let cached = if hv.shared {
        m.hugetlb.inodes[&hv.inode].cache.get(&idx).copied()
    } else {
        None
    };
    let folio = match cached {
        Some(folio) => folio,
        None => {
            if !hv.shared {
                mm.anon_vma_prepare(haddr);
            }
            let folio = alloc_hugetlb_folio(m, vma, &hv, haddr, false)
                .ok_or(Fault::Sigbus { addr: haddr })?;
            let f = m.hugetlb.folios.get_mut(&folio).expect("folio");
            if hv.shared {
                // hugetlb_add_to_page_cache.
                f.restore_reserve = false;
                f.in_page_cache = true;
                m.hugetlb
                    .inodes
                    .get_mut(&hv.inode)
                    .expect("inode")
                    .cache
                    .insert(idx, folio);
            }
            folio
        }
    };
    huge_pte_alloc(m, mm, hv.hstate, haddr)?;
    let f = m.hugetlb.folios.get_mut(&folio).expect("folio");
    if !hv.shared && cached.is_none() {
        // hugetlb_add_new_anon_rmap.
        f.restore_reserve = false;
        f.anon = true;
    }
    f.mapcount += 1;
    let writable = hv.shared && vma.flags & Vma::VM_WRITE != 0;
    mm.hugetlb_ptes.insert(haddr, HugePte { folio, writable });
    if write && !hv.shared {
        return hugetlb_wp(m, mm, vma, haddr);
    }
    Ok(())
}

/// set_huge_ptep_writable: the huge PTE at `haddr` allows writes now.
fn set_huge_ptep_writable(mm: &mut MmStruct, haddr: u64) {
    if let Some(pte) = mm.hugetlb_ptes.get_mut(&haddr) {
        pte.writable = true;
    }
}

/// hugetlb_wp: a write to a read-only huge PTE.
fn hugetlb_wp(m: &mut Machine, mm: &mut MmStruct, vma: &Vma, haddr: u64) -> Result<(), Fault> {
    let hv = hv_of(vma);
    let pte = mm.hugetlb_ptes[&haddr];
    if hv.shared {
        set_huge_ptep_writable(mm, haddr);
        return Ok(());
    }
    let old = pte.folio;
    loop {
        let f = m.hugetlb.folios.get_mut(&old).expect("folio");
        if f.mapcount == 1 && f.anon {
            set_huge_ptep_writable(mm, haddr);
            return Ok(());
        }
        let cow_from_owner = hv.owner && f.anon;
        match alloc_hugetlb_folio(m, vma, &hv, haddr, cow_from_owner) {
            Some(new) => {
                let f = m.hugetlb.folios.get_mut(&new).expect("folio");
                f.restore_reserve = false;
                f.anon = true;
                f.mapcount = 1;
                mm.hugetlb_ptes.insert(
                    haddr,
                    HugePte {
                        folio: new,
                        writable: true,
                    },
                );
                m.hugetlb.folios.get_mut(&old).expect("folio").mapcount -= 1;
                folio_put(m, old);
                return Ok(());
            }
            None if cow_from_owner => {
                unmap_ref_private(m, &hv, hv.index(vma, haddr), old);
                // retry_avoidcopy: the page is this mm's alone now, unless
                // another of its own mappings holds it too.
                if m.hugetlb.folios[&old].mapcount != 1 {
                    return Err(Fault::Sigbus { addr: haddr });
                }
            }
            None => return Err(Fault::Sigbus { addr: haddr }),
        }
    }
}

/// unmap_ref_private: the owner could not copy `folio`; every other private
/// mapping of the file without reservations (the children) loses it and is
/// marked HPAGE_RESV_UNMAPPED.
fn unmap_ref_private(m: &mut Machine, hv: &HugetlbVma, idx: u64, folio: Pfn) {
    // The faulting mm is out of the table: the walk reaches the others.
    m.with_mms(None, |m, mms| {
        for mm in mms.iter_mut() {
            unmap_ref_private_mm(m, mm, hv, idx, folio);
        }
    });
}

/// unmap_ref_private's work in one mm: its private, unreserved mapping of
/// `folio` at index `idx` of the file, if any, goes.
fn unmap_ref_private_mm(m: &mut Machine, mm: &mut MmStruct, hv: &HugetlbVma, idx: u64, folio: Pfn) {
    let size = huge_page_size(hv.hstate);
    let vmas: Vec<Vma> = mm.vmas.values().copied().collect();
    for v in vmas {
        let Some(other) = v.hugetlb else { continue };
        if other.inode != hv.inode || other.shared || other.owner {
            continue;
        }
        let nr = (v.end - v.start) / size;
        if idx < other.pgoff || idx >= other.pgoff + nr {
            continue;
        }
        let addr = v.start + (idx - other.pgoff) * size;
        if mm.hugetlb_ptes.get(&addr).map(|p| p.folio) != Some(folio) {
            continue;
        }
        mm.vmas.insert(
            v.start,
            Vma {
                hugetlb: Some(HugetlbVma {
                    unmapped: true,
                    ..other
                }),
                ..v
            },
        );
        mm.hugetlb_ptes.remove(&addr);
        m.hugetlb.folios.get_mut(&folio).expect("folio").mapcount -= 1;
        folio_put(m, folio);
    }
}

/// __unmap_hugepage_range over a whole VMA piece `[start, end)` (huge-page
/// aligned): the pages it unmapped, for the caller's mmu_gather to put
/// (`tlb_finish_mmu`) once every VMA of the unmap is zapped.
pub fn unmap_hugepage_range(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    start: u64,
    end: u64,
) -> Vec<Pfn> {
    let hv = hv_of(vma);
    let h = hv.hstate;
    let addrs: Vec<u64> = mm.hugetlb_ptes.range(start..end).map(|(a, _)| *a).collect();
    let mut gathered = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let pte = mm.hugetlb_ptes.remove(&addr).expect("present");
        let folio = pte.folio;
        let f = m.hugetlb.folios.get_mut(&folio).expect("folio");
        f.mapcount -= 1;
        let private_owner = !hv.shared && hv.resv.is_some() && hv.owner;
        if m.hugetlb.hstates[h].surplus_huge_pages == 0 && private_owner && f.anon {
            f.restore_reserve = true;
            // vma_needs_reservation, then vma_add_reservation: the
            // reservation is not consumed any more.
            let id = hv.resv.expect("owner's resv map");
            let idx = hv.index(vma, addr) as usize;
            let map = m.hugetlb.resv_maps.get_mut(&id).expect("resv map");
            if map.consumed[idx] {
                map.consumed[idx] = false;
            }
        }
        gathered.push(folio);
    }
    gathered
}

/// tlb_finish_mmu for HugeTLB pages: the gathered pages lose the reference
/// their mappings held; the last one frees a page.
pub fn tlb_finish_mmu(m: &mut Machine, gathered: Vec<Pfn>) {
    for folio in gathered {
        folio_put(m, folio);
    }
}

/// copy_hugetlb_page_range: fork shares a private mapping's pages,
/// write-protected in parent and child.
pub fn copy_hugetlb_page_range(
    m: &mut Machine,
    dst: &mut MmStruct,
    src: &mut MmStruct,
    vma: &Vma,
) -> Result<(), Fault> {
    let hv = hv_of(vma);
    let table = if hstate_is_gigantic(hv.hstate) {
        PUD_SIZE << 9
    } else {
        PUD_SIZE
    };
    // huge_pte_alloc wherever the parent has the table of an entry.
    let parent_tables = if hstate_is_gigantic(hv.hstate) {
        &src.pud_tables
    } else {
        &src.pmd_tables
    };
    let with_table: Vec<u64> = (vma.start / table..=(vma.end - 1) / table)
        .filter(|i| parent_tables.contains_key(i))
        .collect();
    for i in with_table {
        huge_pte_alloc(m, dst, hv.hstate, (i * table).max(vma.start))?;
    }
    let ptes: Vec<(u64, HugePte)> = src
        .hugetlb_ptes
        .range(vma.start..vma.end)
        .map(|(a, p)| (*a, *p))
        .collect();
    for (addr, pte) in ptes {
        let f = m.hugetlb.folios.get_mut(&pte.folio).expect("folio");
        f.mapcount += 1;
        let pte = if f.anon {
            HugePte {
                writable: false,
                ..pte
            }
        } else {
            pte
        };
        src.hugetlb_ptes.insert(addr, pte);
        dst.hugetlb_ptes.insert(addr, pte);
    }
    Ok(())
}

/// A read or write of `[start, end)` of HugeTLB VMA `vma`, one byte every
/// `step`: one fault per huge page that needs one.
///
/// No kernel function: user space's loads or stores over a HugeTLB range, each huge page's first access faulting (hugetlb_fault).
pub fn hugetlb_access(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    range: std::ops::Range<u64>,
    step: u64,
    write: bool,
) -> Result<(), Fault> {
    let (start, end) = (range.start, range.end);
    if !vma.allows(write, m.pkeys) {
        return Err(Fault::Sigsegv { addr: start, write });
    }
    let size = huge_page_size(hv_of(vma).hstate);
    let mut addr = start;
    while addr < end {
        let haddr = addr & !(size - 1);
        let vma_now = mm.find_vma(addr).expect("the VMA is still there");
        let needs_fault = match mm.hugetlb_ptes.get(&haddr) {
            None => true,
            Some(p) => write && !p.writable,
        };
        if needs_fault {
            hugetlb_fault(m, mm, &vma_now, addr, write)?;
        }
        // The next access outside this huge page.
        let next = haddr + size;
        addr = if next <= addr {
            addr + step
        } else {
            addr + (next - addr).div_ceil(step) * step
        };
    }
    Ok(())
}

/// smaps_hugetlb_range: Shared_Hugetlb and Private_Hugetlb of `[start, end)`
/// of a HugeTLB VMA, in bytes (a page mapped more than once is shared).
pub fn smaps_hugetlb_range(
    m: &Machine,
    mm: &MmStruct,
    vma: &Vma,
    start: u64,
    end: u64,
) -> (u64, u64) {
    let size = huge_page_size(hv_of(vma).hstate);
    let (mut shared, mut private) = (0, 0);
    for (_, pte) in mm.hugetlb_ptes.range(start..end) {
        if m.hugetlb.folios[&pte.folio].mapcount > 1 {
            shared += size;
        } else {
            private += size;
        }
    }
    (shared, private)
}

/// Every HugeTLB invariant the model keeps, checked: pool counts against
/// the pages, mapcounts against the page tables of `mms`.
pub fn check<'a>(
    m: &Machine,
    mms: impl Iterator<Item = (&'a str, &'a MmStruct)>,
    bad: &mut Vec<String>,
) {
    let mut maps: HashMap<Pfn, u32> = HashMap::default();
    for (name, mm) in mms {
        for (addr, pte) in &mm.hugetlb_ptes {
            match mm.find_vma(*addr) {
                Some(v) if v.hugetlb.is_some() => {}
                _ => bad.push(format!(
                    "{name}: a huge PTE at {addr:#x} outside a HugeTLB VMA"
                )),
            }
            *maps.entry(pte.folio).or_default() += 1;
        }
    }
    let mut per = [(0u64, 0u64); NR_HSTATES];
    for (pfn, f) in &m.hugetlb.folios {
        per[f.hstate].0 += 1;
        per[f.hstate].1 += u64::from(f.free);
        let found = maps.get(pfn).copied().unwrap_or(0);
        if found != f.mapcount {
            bad.push(format!(
                "hugetlb {pfn}: mapcount {} but {found} PTEs map it",
                f.mapcount
            ));
        }
        if f.free && f.refcount() > 0 {
            bad.push(format!("hugetlb {pfn}: free but referenced"));
        }
        if !f.free && f.refcount() == 0 {
            bad.push(format!("hugetlb {pfn}: in use with no reference"));
        }
    }
    for (h, hs) in m.hugetlb.hstates.iter().enumerate() {
        let (total, free) = per[h];
        if total != hs.nr_huge_pages
            || free != hs.free_huge_pages
            || free != hs.freelist.len() as u64
        {
            bad.push(format!(
                "hstate {}kB: nr {} free {} (list {}) but {total} pages, {free} free",
                huge_page_size(h) >> 10,
                hs.nr_huge_pages,
                hs.free_huge_pages,
                hs.freelist.len()
            ));
        }
        if hs.surplus_huge_pages > hs.nr_huge_pages {
            bad.push(format!(
                "hstate {}kB: more surplus than pages",
                huge_page_size(h) >> 10
            ));
        }
    }
}
