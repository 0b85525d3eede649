//! Page faults on anonymous memory.
//!
//! Follows Linux 6.18 `mm/memory.c`:
//! - `handle_mm_fault` counts PGFAULT; `__handle_mm_fault` allocates the PUD
//!   and PMD tables on the first fault in their range (`__pud_alloc`,
//!   `__pmd_alloc`), then dispatches on the PMD entry: an empty one goes to
//!   `do_huge_pmd_anonymous_page` when the VMA allows the PMD order (else, or
//!   on fallback, a PTE table is allocated), a huge zero PMD or a
//!   write-protected THP to `do_huge_zero_wp_pmd` / `do_huge_pmd_wp_page`
//!   (both in `huge_memory_fault`), and what is left to `handle_pte_fault`;
//! - `do_anonymous_page` with `alloc_anon_folio` for multi-size THP (a read
//!   maps the shared zero page);
//! - `do_wp_page` for write faults on read-only anon PTEs (the shared zero
//!   page, or a page fork shared: reused when exclusive,
//!   `wp_can_reuse_anon_folio`, else copied by `wp_page_copy` into a new
//!   order-0 folio).
//!
//! The unmap side of the same file (`zap_page_range`, `zap_pte_range`) is
//! `memory_zap`, below the faults (see there why).
//!
//! `access_range` is the process's loads and stores: what the CPU does
//! without a fault where a PTE or PMD allows the access, and otherwise what
//! the arch fault handler (`do_user_addr_fault`, arch/x86/mm/fault.c) does
//! before `handle_mm_fault`: find the VMA and check the access.
//! Inside a page table, a fault on an empty PTE that can only get an order-0
//! folio (a read, or a write where no mTHP order is allowed) is handled in
//! the access loop itself (`do_anonymous_page_small`): the same steps as
//! handle_mm_fault -> do_anonymous_page, without the dispatch, because
//! first touch is what large workloads do most. `zap_pte_range` and fork's
//! `copy_pte_range` likewise handle a small folio's PTE inline.
//!
//! Every new folio is charged to the process's memcg after its allocation
//! (`mem_cgroup_charge`, see memcontrol_charge): alloc_anon_folio falls back to the
//! next order when a large folio's charge fails, and an order-0 charge
//! (`folio_prealloc`, GFP_KERNEL) that fails ends the fault in
//! VM_FAULT_OOM. The inline order-0 path is taken only where a charge
//! cannot fail (no memcg limit).
//!
//! File VMAs (`filemap`): `do_fault` is do_read_fault (with
//! do_fault_around), do_cow_fault and do_shared_fault; `do_wp_page` copies
//! a page cache page of a private mapping and makes a shared mapping's
//! page writable in place (wp_page_shared).
//!
//! Simplifications: no userfaultfd, no swap; no retries (the model has no concurrency, so the rechecks under the PTE lock
//! always pass); a write to memory the VMA does not allow, or to no VMA, is a
//! SIGSEGV reported as an error rather than a signal; no LRU batches (the
//! extra reference they hold is what `lru_add_drain` in the reuse check
//! drops, so the model starts where the kernel ends up); page content is one
//! bit, all zero or not: a store of non-zero data clears it, a store of zero
//! leaves it. For the utilization report (`thp_utilization`) every store of
//! the workload, zero or not, also marks the page written (`pg::WRITTEN`);
//! GUP's write fault (`Access::stores` false) stores nothing and marks nothing.
//! Every store also sets the dirty bit of the PTE or PMD it goes through
//! (`pgtable`: what the MMU does; only MADV_FREE clears it); the store loop
//! touches the bits only in a table that has a clean one (a test made once
//! per table, outside the loop).

use crate::filemap::{
    do_fault_around, folio_add_file_rmap_pte, folio_remove_file_rmap_pte, page_is_file,
    set_pte_read, shmem_fault,
};
use crate::gfp::Gfp;
use crate::huge_memory::{vma_thp_gfp_mask, PmdFault};
use crate::huge_memory_fault::{
    do_huge_pmd_anonymous_page, do_huge_pmd_wp_page, do_huge_zero_wp_pmd,
};
use crate::huge_mm::{
    highest_order, thp_vma_allowable_orders, thp_vma_denials, thp_vma_suitable_orders,
};
use crate::memcontrol_charge::mem_cgroup_charge;
use crate::mm_types::{
    pg, Fault, FileVma, MmId, MmStruct, Pfn, Vma, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE, PUD_SIZE,
};
use crate::page_alloc::{alloc_folio, free_folio, vma_alloc_folio};
use crate::pgtable::{pte_index, Pmd, Pte, PteTable};
use crate::rmap;
use crate::sparse::page_folio;
use crate::thp_utilization::{copy_content, set_folio_cause, FolioCause};
use crate::trace::Step;
use crate::vmstat::{Counted, MthpStat, VmEvent};
use crate::Machine;

/// __pud_alloc and __pmd_alloc: the PUD and PMD tables above `addr`, if this
/// is the first fault in their range. They are page-table pages like PTE
/// tables (NR_PAGETABLE).
///
/// Named for __pud_alloc and __pmd_alloc together: the model allocates both levels in one step.
fn pud_pmd_alloc(m: &mut Machine, mm: &mut MmStruct, addr: u64) -> Result<(), Fault> {
    for (size, tables) in [
        (PUD_SIZE << 9, &mut mm.pud_tables),
        (PUD_SIZE, &mut mm.pmd_tables),
    ] {
        if let std::collections::btree_map::Entry::Vacant(e) = tables.entry(addr / size) {
            e.insert(m.pte_alloc_one()?);
        }
    }
    Ok(())
}

/// handle_mm_fault for one access at `addr`, which the caller found unmapped
/// (or mapped read-only for a write). Counts PGFAULT.
pub fn handle_mm_fault(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    m.stat.count_vm_event(VmEvent::PgFault);
    m.trace_fault(addr, write);
    let r = __handle_mm_fault(m, mm, vma, addr, write);
    m.trace_fault_end();
    r
}

/// __handle_mm_fault: the PMD-level dispatch, then handle_pte_fault.
fn __handle_mm_fault(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    let index = addr / PMD_SIZE;
    match mm.pmds.get(&index) {
        None => {
            pud_pmd_alloc(m, mm, addr)?;
            let pmd = 1 << HPAGE_PMD_ORDER;
            let pmd_allowed = thp_vma_allowable_orders(&m.thp, mm, vma, pmd) != 0;
            if m.tracing() {
                let denied = thp_vma_denials(&m.thp, mm, vma, pmd);
                m.trace(|| Step::Allowable {
                    pmd: true,
                    orders: if pmd_allowed { pmd } else { 0 },
                    denied,
                });
            }
            if pmd_allowed {
                if let PmdFault::Done = do_huge_pmd_anonymous_page(m, mm, vma, addr, write)? {
                    return Ok(());
                }
            }
            // pte_alloc, unless the fallback above already left a table.
            if !mm.pmds.contains_key(&index) {
                let page = m.pte_alloc_one()?;
                mm.pmds.insert(index, Pmd::Table(PteTable::new(page)));
            }
        }
        Some(Pmd::HugeZero { .. }) => {
            debug_assert!(write, "read fault on a mapped huge zero PMD");
            if let PmdFault::Done = do_huge_zero_wp_pmd(m, mm, vma, addr)? {
                return Ok(());
            }
        }
        Some(Pmd::Huge { .. }) => {
            debug_assert!(write, "read fault on a mapped PMD");
            if let PmdFault::Done = do_huge_pmd_wp_page(m, mm, addr) {
                return Ok(());
            }
        }
        Some(Pmd::Table(_)) => {}
    }
    handle_pte_fault(m, mm, vma, addr, write)
}

fn handle_pte_fault(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    let pte = table(mm, addr).ptes[pte_index(addr)];
    if pte.is_none() {
        if let Some(file) = vma.file {
            return do_fault(m, mm, vma, &file, addr, write);
        }
        return do_anonymous_page(m, mm, vma, addr, write);
    }
    debug_assert!(write && !pte.is_writable(), "fault on a usable PTE");
    do_wp_page(m, mm, vma, addr)
}

fn table(mm: &mut MmStruct, addr: u64) -> &mut PteTable {
    match mm.pmds.get_mut(&(addr / PMD_SIZE)) {
        Some(Pmd::Table(t)) => t,
        _ => unreachable!("PTE-level fault without a page table"),
    }
}

/// do_fault for a file VMA. A read maps the page cache page and its
/// neighbours (do_read_fault, with do_fault_around; a shared anonymous
/// mapping's page that is not there yet is allocated by shmem_fault). A
/// write to a private mapping copies the page cache page into a new anon
/// order-0 folio (do_cow_fault: folio_prealloc, __do_fault,
/// copy_mc_user_highpage, finish_fault); to a shared one, maps the shmem
/// page writable and dirties it (do_shared_fault, fault_dirty_shared_page).
fn do_fault(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    file: &FileVma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    let index = file.linear_page_index(vma, addr);
    let i = pte_index(addr);
    if !write {
        // The page cache page, order 0, and its neighbours.
        m.trace(|| Step::Mapped { order: 0 });
        do_fault_around(m, table(mm, addr), vma, file, addr);
        if table(mm, addr).ptes[i].is_none() {
            let page = shmem_fault(m, file.inode, index)?;
            folio_add_file_rmap_pte(m, page);
            set_pte_read(table(mm, addr), vma, file, i, page);
        }
        return Ok(());
    }
    let writable = vma.flags & Vma::VM_WRITE != 0;
    if file.shared {
        m.trace(|| Step::Mapped { order: 0 });
        let page = shmem_fault(m, file.inode, index)?;
        folio_add_file_rmap_pte(m, page);
        m.zone.memmap.page_mut(page).set(pg::DIRTY);
        let t = table(mm, addr);
        t.ptes[i] = Pte::new(page, writable);
        t.pte_mkdirty(i);
        return Ok(());
    }
    // do_cow_fault: the anon folio first, then __do_fault's page cache page
    // (shmem_fault brings it in when the file has a hole there).
    let mm_id = mm.mm_id;
    let (new, _) = folio_prealloc(m, mm, mm_id)?;
    let page = match shmem_fault(m, file.inode, index) {
        Ok(page) => page,
        Err(e) => {
            free_folio(m, new);
            return Err(e);
        }
    };
    m.trace(|| Step::Mapped { order: 0 });
    copy_content(m, page, new);
    rmap::folio_add_new_anon_rmap(m, new, 0, false, mm_id, 0);
    m.stat.add_mm_anon(&mut mm.anon_rss, 1);
    let t = table(mm, addr);
    t.ptes[i] = Pte::new(new, writable);
    t.pte_mkdirty(i);
    Ok(())
}

/// do_anonymous_page: a fault on an empty PTE. Reads map the shared zero page;
/// writes map a new folio of the largest order alloc_anon_folio can get.
fn do_anonymous_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<(), Fault> {
    if !write {
        m.trace(|| Step::ZeroPage { huge: false });
        table(mm, addr).ptes[pte_index(addr)] = Pte::ZERO;
        return Ok(());
    }
    let (folio, order) = alloc_anon_folio(m, mm, vma, addr)?;
    m.trace(|| Step::Mapped { order });
    let nr = 1u64 << order;
    let start = addr & !((PAGE_SIZE << order) - 1);
    let pgoff = vma.linear_page_index(start);
    rmap::folio_add_new_anon_rmap(m, folio, order, false, mm.mm_id, pgoff);
    if order > 0 {
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultAlloc);
        set_folio_cause(m, folio, FolioCause::Fault);
    }
    m.stat.add_mm_anon(&mut mm.anon_rss, nr);
    let writable = vma.flags & Vma::VM_WRITE != 0;
    let first = pte_index(start);
    let t = table(mm, addr);
    for i in 0..nr as usize {
        t.ptes[first + i] = Pte::new(Pfn(folio.0 + i as u64), writable);
        t.pte_mkdirty(first + i);
    }
    Ok(())
}

/// do_anonymous_page when no large order is allowed, for the caller's
/// fast path: counts the fault (PGFAULT) and returns the PTE to install —
/// the zero page for a read, a new order-0 folio for a write (the caller
/// counts it in MM_ANONPAGES) — or None when no page is left (VM_FAULT_OOM).
///
/// No kernel function of its own: the order-0 half of do_anonymous_page, which the kernel has inline, split out as the fast path.
#[inline]
fn do_anonymous_page_small(
    m: &mut Machine,
    mm_id: MmId,
    write: bool,
    writable: bool,
) -> Option<Pte> {
    m.stat.count_vm_event(VmEvent::PgFault);
    if !write {
        return Some(Pte::ZERO);
    }
    let folio = alloc_folio(m, 0)?;
    if m.memcg.is_active() {
        // No limit here (see access_range): the charge cannot fail.
        let gfp = crate::gfp::Gfp::HIGHUSER_MOVABLE;
        let charged = crate::memcontrol_charge::mem_cgroup_charge(m, None, mm_id, folio, 0, gfp);
        debug_assert!(charged.is_ok());
    }
    rmap::folio_add_new_anon_rmap(m, folio, 0, false, mm_id, 0);
    Some(Pte::new(folio, writable))
}

/// alloc_anon_folio: the largest allowed order whose naturally aligned range
/// fits the VMA and has only empty PTEs, trying smaller orders when the
/// allocation or the memcg charge fails (each failure counts
/// anon_fault_fallback, a charge failure anon_fault_fallback_charge too),
/// then order 0 (folio_prealloc: its charge failing is VM_FAULT_OOM).
fn alloc_anon_folio(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
) -> Result<(Pfn, u32), Fault> {
    let below_pmd = (1 << HPAGE_PMD_ORDER) - 1;
    let allowed = thp_vma_allowable_orders(&m.thp, mm, vma, below_pmd);
    if m.tracing() {
        let denied = thp_vma_denials(&m.thp, mm, vma, below_pmd);
        m.trace(|| Step::Allowable {
            pmd: false,
            orders: allowed,
            denied,
        });
    }
    let mut orders = thp_vma_suitable_orders(vma, addr, allowed);
    if allowed != 0 {
        m.trace(|| Step::Suitable {
            orders,
            unsuitable: allowed & !orders,
        });
    }
    // The PTE-emptiness filter needs the table only when some order is left.
    if orders != 0 {
        let t = table(mm, addr);
        while orders != 0 {
            let order = highest_order(orders);
            let first = pte_index(addr & !((PAGE_SIZE << order) - 1));
            if t.range_none(first, 1 << order) {
                break;
            }
            orders &= !(1 << order);
            m.trace(|| Step::PtesPopulated { order });
        }
    }
    let gfp = vma_thp_gfp_mask(&m.thp, vma);
    let mm_id = mm.mm_id;
    while orders != 0 {
        let order = highest_order(orders);
        let mut counters = vec![Counted::Mthp(MthpStat::AnonFaultFallback)];
        if let Some(folio) = vma_alloc_folio(m, Some(&mut *mm), gfp, order) {
            match mem_cgroup_charge(m, Some(&mut *mm), mm_id, folio, order, gfp) {
                Ok(()) => return Ok((folio, order)),
                Err(_) => {
                    m.stat
                        .count_mthp_stat(order, MthpStat::AnonFaultFallbackCharge);
                    free_folio(m, folio);
                    counters.insert(0, Counted::Mthp(MthpStat::AnonFaultFallbackCharge));
                }
            }
        }
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultFallback);
        m.trace(|| Step::Fallback { order, counters });
        orders &= !(1 << order);
    }
    folio_prealloc(m, mm, mm_id)
}

/// folio_prealloc: an order-0 folio charged with GFP_KERNEL (limit reclaim,
/// then the OOM killer), or VM_FAULT_OOM.
fn folio_prealloc(m: &mut Machine, mm: &mut MmStruct, mm_id: MmId) -> Result<(Pfn, u32), Fault> {
    let gfp = Gfp::HIGHUSER_MOVABLE;
    let Some(folio) = vma_alloc_folio(m, Some(&mut *mm), gfp, 0) else {
        m.trace(|| Step::Oom);
        return Err(Fault::Oom);
    };
    if let Err(e) = mem_cgroup_charge(m, Some(mm), mm_id, folio, 0, gfp) {
        free_folio(m, folio);
        m.trace(|| Step::Oom);
        return Err(e);
    }
    Ok((folio, 0))
}

/// do_wp_page: a write to a read-only PTE of a writable VMA. The shared zero
/// page is always copied; an anon page is reused in place when it is
/// PageAnonExclusive or wp_can_reuse_anon_folio says nobody else can see it,
/// and copied otherwise.
fn do_wp_page(m: &mut Machine, mm: &mut MmStruct, vma: &Vma, addr: u64) -> Result<(), Fault> {
    let pte = table(mm, addr).ptes[pte_index(addr)];
    if let (Some(page), Some(FileVma { shared: true, .. })) = (pte.pfn(), vma.file) {
        // wp_page_shared: the shared page itself becomes writable, dirty.
        m.trace(|| Step::Wp {
            huge: false,
            zero: false,
            reused: true,
        });
        m.zone.memmap.page_mut(page).set(pg::DIRTY);
        let t = table(mm, addr);
        t.ptes[pte_index(addr)] = pte.mkwrite();
        t.pte_mkdirty(pte_index(addr));
        return Ok(());
    }
    let Some(page) = pte.pfn() else {
        m.trace(|| Step::Wp {
            huge: false,
            zero: true,
            reused: false,
        });
        return wp_page_copy(m, mm, vma, addr, None);
    };
    let folio = page_folio(m, page);
    // Only an anon folio can be reused; a page cache page is copied.
    let anon = !page_is_file(m, page);
    let reused = anon
        && (m.zone.memmap.page(page).test(pg::ANON_EXCLUSIVE) || wp_can_reuse_anon_folio(m, folio));
    m.trace(|| Step::Wp {
        huge: false,
        zero: false,
        reused,
    });
    if reused {
        // wp_page_reuse: only the faulting PTE becomes writable.
        m.zone.memmap.page_mut(page).set(pg::ANON_EXCLUSIVE);
        let t = table(mm, addr);
        t.ptes[pte_index(addr)] = pte.mkwrite();
        t.pte_mkdirty(pte_index(addr));
        return Ok(());
    }
    wp_page_copy(m, mm, vma, addr, Some((folio, page)))
}

/// wp_can_reuse_anon_folio: a small folio is reusable when its only
/// reference is this mapping; a large one (__wp_can_reuse_large_anon_folio)
/// when more than one of its pages is mapped, no other MM maps it, and every
/// reference is a mapping (no pin).
fn wp_can_reuse_anon_folio(m: &Machine, folio: Pfn) -> bool {
    if m.zone.memmap.page(folio).order() == 0 {
        return rmap::folio_ref_count(m, folio) == 1;
    }
    let mapcount = rmap::folio_mapcount(m, folio);
    // With a single page mapped, copying it frees the large folio.
    if mapcount <= 1 || m.folio_mm_ids.get(&folio).is_some_and(|ids| ids.shared) {
        return false;
    }
    mapcount == u64::from(rmap::folio_ref_count(m, folio))
}

/// wp_page_copy: the faulting page (or the zero page, for `None`) is copied
/// into a new order-0 folio mapped writable in its place; the old page loses
/// this mapping and its reference.
fn wp_page_copy(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    old: Option<(Pfn, Pfn)>,
) -> Result<(), Fault> {
    // folio_prealloc: the copy is charged with GFP_KERNEL (the allocation
    // itself is not a decision `hugelab explain` shows: do_wp_page's is).
    let new = alloc_folio(m, 0).ok_or(Fault::Oom)?;
    let mm_id = mm.mm_id;
    if let Err(e) = mem_cgroup_charge(m, Some(&mut *mm), mm_id, new, 0, Gfp::HIGHUSER_MOVABLE) {
        free_folio(m, new);
        m.trace(|| Step::Oom);
        return Err(e);
    }
    if let Some((_, page)) = old {
        copy_content(m, page, new);
    }
    rmap::folio_add_new_anon_rmap(m, new, 0, false, mm.mm_id, 0);
    let writable = vma.flags & Vma::VM_WRITE != 0;
    let t = table(mm, addr);
    t.ptes[pte_index(addr)] = Pte::new(new, writable);
    t.pte_mkdirty(pte_index(addr));
    match old {
        Some((_, page)) if page_is_file(m, page) => {
            folio_remove_file_rmap_pte(m, page);
            m.stat.add_mm_anon(&mut mm.anon_rss, 1);
        }
        Some((folio, page)) => {
            if rmap::folio_remove_rmap_ptes(m, folio, page, 1, mm.mm_id) {
                free_folio(m, folio);
            }
        }
        None => {
            m.stat.add_mm_anon(&mut mm.anon_rss, 1);
        }
    }
    Ok(())
}

/// One `read` or `write` statement's access pattern.
#[derive(Clone, Copy, Debug)]
pub struct Access {
    /// Bytes between two accessed bytes.
    pub step: u64,
    pub write: bool,
    /// A store of a zero byte (the page content stays as it was).
    pub zero: bool,
    /// A write stores a byte (the workload's store, which marks the page
    /// `pg::WRITTEN`); false for a write fault that stores nothing (GUP).
    pub stores: bool,
}

/// One store into `page`: written, and no longer all zeroes unless `zero`.
#[inline]
fn store(m: &mut Machine, page: Pfn, zero: bool) {
    // One branch-free update: the hot loop of every write to mapped memory.
    let clear = if zero { 0 } else { pg::ZEROED };
    m.zone.memmap.page_mut(page).set_clear(pg::WRITTEN, clear);
}

/// Before writes to `vma` from `start`: its anon_vma, which every write
/// fault of a private mapping needs (vmf_anon_prepare); a write that faults
/// nowhere finds it there already.
#[inline]
fn write_anon_vma_prepare(mm: &mut MmStruct, vma: &Vma, start: u64) {
    let shared = vma.file.is_some_and(|f| f.shared);
    if !vma.anon_vma && !shared {
        mm.anon_vma_prepare(start);
    }
}

/// Loads or stores one byte every `step` bytes of `[start, end)` inside `vma`,
/// faulting as needed. A store of non-zero data marks the page's content dirty
/// (no longer all zeroes); a store of zero leaves it as it was.
///
/// No kernel function: user space's loads or stores over a range, each page's first access faulting (handle_mm_fault).
pub fn access_range(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    start: u64,
    end: u64,
    access: Access,
) -> Result<(), Fault> {
    let Access {
        step,
        write,
        zero,
        stores,
    } = access;
    if !vma.allows(write, m.pkeys) {
        return Err(Fault::Sigsegv { addr: start, write });
    }
    if write {
        write_anon_vma_prepare(mm, vma, start);
    }
    let stores = write && stores;
    // Whether a write fault on an empty PTE can only get an order-0 folio
    // (alloc_anon_folio with no order allowed): then it is handled inline.
    let below_pmd = (1 << HPAGE_PMD_ORDER) - 1;
    let small_only = thp_vma_allowable_orders(&m.thp, mm, vma, below_pmd) == 0
        && !m.memcg.limited(m.memcg.mm_memcg(mm.mm_id));
    let writable = vma.flags & Vma::VM_WRITE != 0;
    // A file VMA's empty PTEs fault the long way (do_fault).
    let file = vma.file.is_some();
    let mm_id = mm.mm_id;
    let mut addr = start;
    while addr < end {
        let slot_end = ((addr / PMD_SIZE) + 1) * PMD_SIZE;
        let limit = end.min(slot_end);
        // Fast path: accesses that need no fault, a page table at a time.
        match mm.pmds.get_mut(&(addr / PMD_SIZE)) {
            Some(Pmd::Table(t)) => {
                let mut faulted = 0u64;
                let mut oom = false;
                // Stores dirty their PTEs; only MADV_FREE leaves any clean,
                // so the loop pays for the bit only in a table that has one.
                let clean = !t.all_dirty();
                let mkdirty = stores && clean;
                while addr < limit {
                    let i = pte_index(addr);
                    let pte = t.ptes[i];
                    if let Some(pfn) = pte.pfn() {
                        if write && !pte.is_writable() {
                            break;
                        }
                        if stores {
                            store(m, pfn, zero);
                            if mkdirty {
                                t.pte_mkdirty(i);
                            }
                        }
                        addr += step;
                        continue;
                    }
                    if pte.is_zero_page() {
                        if write {
                            break;
                        }
                        addr += step;
                        continue;
                    }
                    // A traced run takes every fault the long way, where
                    // its decisions are recorded.
                    if (write && !small_only) || file || m.tracing() {
                        break;
                    }
                    // handle_mm_fault -> do_anonymous_page at order 0, inline:
                    // the first-touch hot path. The access is retried.
                    let Some(new) = do_anonymous_page_small(m, mm_id, write, writable) else {
                        oom = true;
                        break;
                    };
                    t.ptes[i] = new;
                    if clean {
                        t.pte_mkdirty_if(i, write);
                    }
                    faulted += u64::from(write);
                }
                m.stat.add_mm_anon(&mut mm.anon_rss, faulted);
                if oom {
                    return Err(Fault::Oom);
                }
                if addr >= limit {
                    continue;
                }
            }
            Some(Pmd::Huge {
                pfn,
                writable,
                dirty,
                ..
            }) if !write || *writable => {
                let pfn = *pfn;
                *dirty |= stores;
                while addr < limit {
                    if stores {
                        store(m, Pfn(pfn.0 + pte_index(addr) as u64), zero);
                    }
                    addr += step;
                }
                continue;
            }
            Some(Pmd::HugeZero { .. }) if !write => {
                addr = addr + (limit - addr).div_ceil(step) * step;
                continue;
            }
            _ => {}
        }
        handle_mm_fault(m, mm, vma, addr, write)?;
        // Retry the same address: it is mapped now, and the fast path stores the byte.
    }
    Ok(())
}
