//! The page cache of the workload's files (`mmap ... file=<name>`), and the
//! fault-around that maps it.
//!
//! Follows Linux 6.18 `mm/filemap.c` (`filemap_map_pages`) and `mm/shmem.c`
//! (the kernel backend's files are memfds: shmem), with `do_fault_around`
//! from `mm/memory.c`:
//! - a file is one inode whose page cache every mapping of its name shares;
//!   it is as long as the largest offset + size any mapping of it used so
//!   far (the kernel backend's runner `ftruncate`s its memfd), and its page
//!   cache starts empty: a page comes in at the first fault on it, from any
//!   process (`shmem_fault`: shmem_get_folio_gfp with SGP_CACHE allocates a
//!   zeroed, uptodate order-0 folio in a hole, shmem_enabled `never`), for
//!   a read fault and for the source page of a write's do_cow_fault alike.
//!   So fault-around (which maps only pages already in the page cache, as
//!   `next_uptodate_folio` does) maps only pages some earlier fault brought
//!   in, and a replayed recording faults where the recorded program did;
//! - the page cache holds one reference on each page, each PTE mapping one
//!   more and a mapcount; a page is PG_dirty only once written through a
//!   shared mapping (a private mapping's write copies it), which is what
//!   smaps shows (`*_Clean` else); pages are not anonymous: they are in
//!   `Rss` but not `Anonymous`, nor in `nr_anon_pages` / `AnonPages`;
//! - `do_fault_around`: a read fault maps, besides its own page, the page
//!   cache pages of the `fault_around_bytes` (64 KiB) window around it whose
//!   PTEs are empty, the window aligned down, moved up to the VMA's start
//!   and then cut at the VMA's end and the page table's (PMD) end; only the
//!   faulting access counts as a fault.
//!
//! Simplifications: no readahead, writeback, truncation or reclaim of the
//! page cache (no statement shrinks a file or drops its pages; `reclaim`
//! drops slab only on the kernel too); the pages are not charged to any
//! memory cgroup (the kernel charges a page to the memcg of the process
//! whose fault brought it in, shmem_alloc_and_add_folio's
//! mem_cgroup_charge; the model charges no page cache page); the files
//! stay until the end of the run, as the runner's memfds do; the gauges of the page cache (`Shmem`, `Cached`,
//! `nr_file_pages`, `nr_mapped`) are not modelled; fault_around_bytes is
//! the default (debugfs, which could change it, is locked down here).

use crate::mm_types::{pg, Fault, FileVma, Pfn, Vma, PAGE_SHIFT, PAGE_SIZE};
use crate::page_alloc::alloc_folio;
use crate::pgtable::{pte_index, Pte, PteTable, PTRS_PER_PTE};
use crate::Machine;
use std::collections::BTreeMap;

/// fault_around_bytes' default (mm/memory.c), in pages.
pub const FAULT_AROUND_PAGES: u64 = 65536 / PAGE_SIZE;

/// The page cache of every file of the workload, and of every shared
/// anonymous mapping's shmem object.
#[derive(Default)]
pub struct PageCache {
    /// Inodes of the workload's files by name.
    names: BTreeMap<String, u32>,
    /// Each inode's pages, by file page index (`i_pages`, sparse as the
    /// xarray is: a file of a terabyte with one page faulted holds one
    /// entry); no entry where no page exists (a shmem object's page never
    /// faulted, or an inode evicted).
    pages: Vec<BTreeMap<u64, Pfn>>,
}

impl PageCache {
    /// The inode of `name`, if a mapping created it.
    pub fn inode(&self, name: &str) -> Option<u32> {
        self.names.get(name).copied()
    }

    /// filemap_get_entry: the page of file page `index`.
    pub fn find_get_page(&self, inode: u32, index: u64) -> Option<Pfn> {
        self.pages.get(inode as usize)?.get(&index).copied()
    }

    /// Whether no file and no shared anonymous mapping was ever made.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// Every page cache page, for the invariant checks.
    pub fn all_pages(&self) -> impl Iterator<Item = Pfn> + '_ {
        self.pages.iter().flat_map(|f| f.values()).copied()
    }

    fn new_inode(&mut self) -> u32 {
        let inode = self.pages.len() as u32;
        self.pages.push(BTreeMap::new());
        inode
    }
}

/// filemap_add_folio of a new order-0 page: the page cache's reference.
fn add_page(m: &mut Machine, inode: u32, index: u64) -> Result<Pfn, Fault> {
    let pfn = alloc_folio(m, 0).ok_or(Fault::Oom)?;
    m.zone.memmap.page_mut(pfn).private = 1;
    m.page_cache.pages[inode as usize].insert(index, pfn);
    Ok(pfn)
}

/// The file `name`, made long enough for a mapping (what the kernel
/// backend's runner does with `ftruncate` before the mapping): its inode.
/// The new pages are holes, which the sparse page cache does not hold: a
/// page comes into the page cache at the first fault on it (`shmem_fault`),
/// zero-filled, and no fault reaches past the mappings' ends.
pub fn file_at_least(m: &mut Machine, name: &str) -> u32 {
    match m.page_cache.names.get(name) {
        Some(&i) => i,
        None => {
            let i = m.page_cache.new_inode();
            m.page_cache.names.insert(name.to_string(), i);
            i
        }
    }
}

/// shmem_zero_setup: the shmem object of a new shared anonymous mapping of
/// its size, with no page yet; its inode.
pub fn shmem_zero_setup(m: &mut Machine) -> u32 {
    m.page_cache.new_inode()
}

/// shmem_get_folio (SGP_CACHE) for shmem_fault: the page of `index`,
/// allocated zeroed and marked uptodate (order 0: shmem_enabled never)
/// when it has none yet, for a file's read fault, the source page of its
/// do_cow_fault and a shared anonymous mapping's fault alike. Not PG_dirty
/// (only a write through a shared mapping dirties it). Not charged to a
/// memory cgroup (a simplification, see the module doc).
pub fn shmem_fault(m: &mut Machine, inode: u32, index: u64) -> Result<Pfn, Fault> {
    match m.page_cache.find_get_page(inode, index) {
        Some(pfn) => Ok(pfn),
        None => add_page(m, inode, index),
    }
}

/// shmem_evict_inode (through fput of the last VMA mapping a shared
/// anonymous region's object): its pages, none mapped, are freed.
pub fn shmem_evict_inode(m: &mut Machine, inode: u32) {
    let mut pages = std::mem::take(&mut m.page_cache.pages[inode as usize]);
    // A page still mapped stays (none is, when the last VMA went).
    pages.retain(|_, &mut pfn| {
        if m.zone.memmap.page(pfn).mapcount != 0 {
            return true;
        }
        m.zone.free_pages(pfn, 0);
        false
    });
    m.page_cache.pages[inode as usize] = pages;
}

/// Whether `page` (mapped by a PTE) is a page cache page: not anonymous,
/// and a normal page (the zero page has no frame in the model).
#[inline]
pub fn page_is_file(m: &Machine, page: Pfn) -> bool {
    !m.zone.memmap.page(page).test(pg::ANON)
}

/// folio_add_file_rmap_ptes + the reference the PTE takes: one more
/// mapping of a page cache page.
#[inline]
pub fn folio_add_file_rmap_pte(m: &mut Machine, page: Pfn) {
    let p = m.zone.memmap.page_mut(page);
    p.mapcount += 1;
    p.private += 1;
}

/// folio_remove_rmap_ptes + folio_put of a page cache page: the page cache
/// keeps its own reference, so the page stays.
#[inline]
pub fn folio_remove_file_rmap_pte(m: &mut Machine, page: Pfn) {
    let p = m.zone.memmap.page_mut(page);
    debug_assert!(
        p.mapcount > 0 && p.private > 1,
        "unmapping an unmapped page cache page"
    );
    p.mapcount -= 1;
    p.private -= 1;
}

/// set_pte_range of a read fault: a private mapping's PTE is read-only (it
/// copies on write); a shared one's is as writable as the VMA
/// (vm_page_prot: shmem needs no write notification); both are clean (only
/// a write fault makes its PTE dirty).
pub fn set_pte_read(t: &mut PteTable, vma: &Vma, file: &FileVma, idx: usize, page: Pfn) {
    let writable = file.shared && vma.flags & Vma::VM_WRITE != 0;
    t.ptes[idx] = Pte::new(page, writable);
    t.pte_mkclean(idx, 1);
}

/// do_fault_around + filemap_map_pages for a read fault at `addr` of the
/// file VMA `vma` whose page table is `t`: maps, read-only, the page cache
/// pages of the window around `addr` whose PTEs are empty (the faulting
/// page among them).
pub fn do_fault_around(m: &mut Machine, t: &mut PteTable, vma: &Vma, file: &FileVma, addr: u64) {
    let nr_pages = FAULT_AROUND_PAGES;
    let pte_off = pte_index(addr) as u64;
    let vma_off = (addr - vma.start) >> PAGE_SHIFT;
    let vma_pages = (vma.end - vma.start) >> PAGE_SHIFT;
    // The window's first PTE, aligned down, but not below the VMA's start.
    let from_pte = (pte_off & !(nr_pages - 1)).max(pte_off - pte_off.min(vma_off));
    // Its end: nr_pages on, cut at the page table's end and the VMA's.
    let to_pte = (from_pte + nr_pages)
        .min(PTRS_PER_PTE as u64)
        .min(pte_off + vma_pages - vma_off);
    let pgoff = file.linear_page_index(vma, addr);
    for i in from_pte..to_pte {
        let idx = i as usize;
        if !t.ptes[idx].is_none() {
            continue;
        }
        // filemap_map_pages stops at the end of the file's page cache.
        let Some(page) = m.page_cache.find_get_page(file.inode, pgoff + i - pte_off) else {
            continue;
        };
        folio_add_file_rmap_pte(m, page);
        set_pte_read(t, vma, file, idx, page);
    }
}

#[cfg(test)]
mod tests {
    use crate::end_counters;

    #[test]
    fn fault_around_moves_up_to_the_vma_start_and_stops_at_its_end() {
        // c brings every page into the page cache (64 faults) and exits.
        // 3 pages into a 64K window: the window runs 16 pages from the
        // VMA's start; at the VMA's end it is cut there.
        let w = hugelab_workload::parse(
            "t.hlw",
            "spawn c\nc mmap all 256K file=f\nc read all\nexpect stat.c.minflt == 64\nc exit\n\
             spawn a\na mmap lib 256K file=f at=0x7e0000203000\na read lib:4K\n\
             expect smaps.a.lib.Rss == 64\na read lib+252K:4K\nexpect smaps.a.lib.Rss == 76\n",
        )
        .unwrap();
        let obs = hugelab_workload::run(&mut crate::Model::default(), &w).unwrap();
        assert_eq!(obs.expects.len(), 3);
        assert_eq!(obs.failed_expects().count(), 0);
        let end = &obs.snapshots.last().unwrap().counters;
        assert_eq!(end["vmstat.pgfault"], 66);
    }

    #[test]
    fn the_page_cache_starts_empty_and_fills_at_faults() {
        // a's read faults on every page: nothing is in the page cache for
        // fault-around; a's write-first fault (do_cow_fault) brings its page
        // in too. b's reads then map what a's faults brought in.
        let c = end_counters(
            "spawn a\nspawn b\na mmap lib 64K align=64K file=f\na read lib:4K\n\
             a write lib+12K:4K\nb mmap lib 64K align=64K file=f\nb read lib+4K:4K\n",
        );
        assert_eq!(c["stat.a.minflt"], 2);
        assert_eq!(c["smaps.a.lib.Rss"], 8);
        assert_eq!(c["smaps.a.lib.Anonymous"], 4);
        // b: page 1 faulted in, pages 0 and 3 mapped around it.
        assert_eq!(c["stat.b.minflt"], 1);
        assert_eq!(c["smaps.b.lib.Rss"], 12);
        assert_eq!(c["smaps.b.lib.Private_Clean"], 8);
        assert_eq!(c["smaps.b.lib.Shared_Clean"], 4);
    }

    #[test]
    fn the_page_cache_is_shared_and_never_anonymous() {
        let c = end_counters(
            "spawn a\nspawn b\na mmap lib 64K align=64K file=libc.so.6\n\
             b mmap lib 64K align=64K file=libc.so.6\na read lib\nb read lib\nb write lib:4K\n",
        );
        assert_eq!(c["smaps.a.lib.Rss"], 64);
        assert_eq!(c["smaps.a.lib.Shared_Clean"], 60);
        assert_eq!(c["smaps.a.lib.Private_Clean"], 4);
        assert_eq!(c["smaps.a.lib.Shared_Dirty"], 0);
        assert_eq!(c["smaps.b.lib.Anonymous"], 4);
        assert_eq!(c["smaps.b.lib.Private_Dirty"], 4);
        assert_eq!(c["vmstat.nr_anon_pages"], 1);
        // a: 16 faults (one a page), b: 1 read fault maps all 16, 1 write.
        assert_eq!(c["vmstat.pgfault"], 18);
    }
}
