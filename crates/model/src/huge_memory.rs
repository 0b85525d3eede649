//! Transparent huge pages for anonymous memory: which orders a VMA may use,
//! the PMD fault and write-fault paths, the huge zero folio and its
//! shrinker, fork of a PMD mapping, split_huge_pmd, split_folio (also as
//! debugfs `split_huge_pages` asks for it), and the deferred split queue with
//! its shrinker and the under-used THP check.
//!
//! Follows Linux 6.18 `mm/huge_memory.c` and `include/linux/huge_mm.h`
//! (`thp_vma_allowable_orders`, `__thp_vma_allowable_orders`,
//! `thp_vma_suitable_order(s)`, `do_huge_pmd_anonymous_page`,
//! `do_huge_zero_wp_pmd`, `do_huge_pmd_wp_page`, `copy_huge_pmd`,
//! `mm_get_huge_zero_folio`, `mm_put_huge_zero_folio`,
//! `shrink_huge_zero_folio_scan`, `__split_huge_pmd_locked`,
//! `split_huge_page_to_list_to_order`, `split_huge_pages_pid`,
//! `deferred_split_folio`, `deferred_split_scan`, `thp_underused`).
//!
//! Simplifications: no userfaultfd, no NUMA (one deferred split queue; a
//! memcg's queue is its part of it, see memcontrol);
//! `defrag` is stored but the allocator has no compaction to apply it with;
//! the vendor knob `anon_beside_full` is stored and must be 0 (the model
//! refuses 1); folios are split to order 0 only (debugfs's new_order is not
//! offered); split_folio finds the PMDs and the zero-filled pages it remaps
//! to the zero page by `rmap::rmap_walk_anon`; a page's content is one bit, all zero or not
//! (`pg::ZEROED`), which is what thp_underused and that remap look at; the
//! shrinkers run only from `vmscan::drop_slab` and walk their whole queue in
//! one call.

use crate::mm_types::{
    page_folio, pg, Fault, Pfn, HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE, PMD_SIZE,
};
use crate::mmap::{MmStruct, Vma};
use crate::mms::MmList;
use crate::page_alloc::free_folio;
use crate::pgtable::{Pmd, Pte, PteTable};
use crate::rmap;
use crate::syscall::{mm_id_of, resolve_range_no_hugetlb};
use crate::trace::Step;
use crate::vmstat::{Counted, MthpStat, VmEvent};
use crate::Machine;
use hugelab_workload::{BackendError, Range, Stmt, ThpDefrag, ThpEnabled, ThpSizeEnabled};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// THP_ORDERS_ALL_ANON: orders 2..=PMD_ORDER (order 1 cannot hold _deferred_list).
pub const THP_ORDERS_ALL_ANON: u32 = ((1 << (HPAGE_PMD_ORDER + 1)) - 1) & !0b11;

/// The sysfs controls under /sys/kernel/mm/transparent_hugepage/.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThpSettings {
    pub enabled: ThpEnabled,
    pub defrag: ThpDefrag,
    pub use_zero_page: bool,
    pub shrink_underused: bool,
    pub anon_beside_full: bool,
    /// `hugepages-<size>kB/enabled`, indexed by order (0 and 1 unused).
    pub size_enabled: [ThpSizeEnabled; HPAGE_PMD_ORDER as usize + 1],
    pub khugepaged: KhugepagedSettings,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KhugepagedSettings {
    pub defrag: u64,
    pub max_ptes_none: u64,
    pub max_ptes_swap: u64,
    pub max_ptes_shared: u64,
    pub pages_to_scan: u64,
    pub scan_sleep_millisecs: u64,
    pub alloc_sleep_millisecs: u64,
}

impl Default for ThpSettings {
    /// The defaults of the development machines (CONFIG_TRANSPARENT_HUGEPAGE_MADVISE=y):
    /// enabled=madvise, defrag=madvise, the PMD size inherit, every other size never.
    fn default() -> Self {
        let mut size_enabled = [ThpSizeEnabled::Never; HPAGE_PMD_ORDER as usize + 1];
        size_enabled[HPAGE_PMD_ORDER as usize] = ThpSizeEnabled::Inherit;
        ThpSettings {
            enabled: ThpEnabled::Madvise,
            defrag: ThpDefrag::Madvise,
            use_zero_page: true,
            shrink_underused: true,
            anon_beside_full: false,
            size_enabled,
            khugepaged: KhugepagedSettings {
                defrag: 1,
                max_ptes_none: HPAGE_PMD_NR - 1,
                max_ptes_swap: HPAGE_PMD_NR / 8,
                max_ptes_shared: HPAGE_PMD_NR / 2,
                pages_to_scan: HPAGE_PMD_NR * 8,
                scan_sleep_millisecs: 10_000,
                alloc_sleep_millisecs: 60_000,
            },
        }
    }
}

impl ThpSettings {
    /// The huge_anon_orders_{always,madvise,inherit} bitmap of `mode`.
    #[inline]
    fn orders_with(&self, mode: ThpSizeEnabled) -> u32 {
        let mut mask = 0;
        for o in 2..=HPAGE_PMD_ORDER {
            mask |= u32::from(self.size_enabled[o as usize] == mode) << o;
        }
        mask
    }
}

/// Page-fault flavour of `thp_vma_allowable_orders` (TVA_PAGEFAULT): the sysfs
/// mask, then the VMA and process vetoes. The fit-in-VMA check is left to the
/// caller, as the fault path does it per address.
pub fn thp_vma_allowable_orders(thp: &ThpSettings, mm: &MmStruct, vma: &Vma, orders: u32) -> u32 {
    if vma.hugetlb.is_some() {
        return 0;
    }
    let hugepage = vma.flags & Vma::VM_HUGEPAGE != 0;
    let mut mask = thp.orders_with(ThpSizeEnabled::Always);
    if hugepage {
        mask |= thp.orders_with(ThpSizeEnabled::Madvise);
    }
    if thp.enabled == ThpEnabled::Always || (hugepage && thp.enabled == ThpEnabled::Madvise) {
        mask |= thp.orders_with(ThpSizeEnabled::Inherit);
    }
    let orders = orders & mask & THP_ORDERS_ALL_ANON;
    if orders == 0 || vma_thp_disabled(mm, vma) {
        return 0;
    }
    orders
}

/// Why thp_vma_allowable_orders leaves each order of `orders` out, for
/// `hugelab explain` (the kernel keeps no reason; this follows its checks).
///
/// No kernel function: the kernel keeps no reason; hugelab's explain wants one per order.
pub fn thp_vma_denials(
    thp: &ThpSettings,
    mm: &MmStruct,
    vma: &Vma,
    orders: u32,
) -> Vec<(u32, crate::trace::Denial)> {
    use crate::trace::Denial;
    let allowed = thp_vma_allowable_orders(thp, mm, vma, orders);
    let hugepage = vma.flags & Vma::VM_HUGEPAGE != 0;
    let mut out = Vec::new();
    for o in (0..=HPAGE_PMD_ORDER).rev() {
        if orders & (1 << o) == 0 || allowed & (1 << o) != 0 || THP_ORDERS_ALL_ANON & (1 << o) == 0
        {
            continue;
        }
        // The sysfs mask first, then the VMA and process vetoes, as
        // thp_vma_allowable_orders and __thp_vma_allowable_orders check.
        let d = match thp.size_enabled[o as usize] {
            ThpSizeEnabled::Never => Denial::SizeNever,
            ThpSizeEnabled::Inherit if thp.enabled == ThpEnabled::Never => Denial::InheritNever,
            ThpSizeEnabled::Madvise if !hugepage => Denial::NotMadvised,
            ThpSizeEnabled::Inherit if thp.enabled == ThpEnabled::Madvise && !hugepage => {
                Denial::NotMadvised
            }
            _ if vma.flags & Vma::VM_NOHUGEPAGE != 0 => Denial::VmNoHugepage,
            _ if mm.thp_disabled => Denial::ProcessDisabled,
            // Allowed by the mask, vetoed by nothing else: cannot happen.
            _ => continue,
        };
        out.push((o, d));
    }
    out
}

/// vma_thp_disabled: MADV_NOHUGEPAGE, then PR_SET_THP_DISABLE, win over MADV_HUGEPAGE.
pub fn vma_thp_disabled(mm: &MmStruct, vma: &Vma) -> bool {
    vma.flags & Vma::VM_NOHUGEPAGE != 0 || mm.thp_disabled
}

/// thp_vma_suitable_order: the naturally aligned block of `order` around `addr`
/// lies inside the VMA.
#[inline]
pub fn thp_vma_suitable_order(vma: &Vma, addr: u64, order: u32) -> bool {
    let size = crate::mm_types::PAGE_SIZE << order;
    let haddr = addr & !(size - 1);
    haddr >= vma.start && haddr + size <= vma.end
}

/// thp_vma_suitable_orders: drops the orders too large for the VMA at `addr`.
pub fn thp_vma_suitable_orders(vma: &Vma, addr: u64, mut orders: u32) -> u32 {
    while orders != 0 {
        let order = highest_order(orders);
        if thp_vma_suitable_order(vma, addr, order) {
            break;
        }
        orders &= !(1 << order);
    }
    orders
}

#[inline]
pub fn highest_order(orders: u32) -> u32 {
    31 - orders.leading_zeros()
}

/// What a PMD-level fault handler tells `__handle_mm_fault`.
pub enum PmdFault {
    Done,
    /// VM_FAULT_FALLBACK: continue at the PTE level.
    Fallback,
}

/// do_huge_pmd_anonymous_page: a fault on an empty PMD of a VMA allowed the PMD order.
pub fn do_huge_pmd_anonymous_page(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
    write: bool,
) -> Result<PmdFault, Fault> {
    let haddr = addr & !(PMD_SIZE - 1);
    let suitable = thp_vma_suitable_order(vma, haddr, HPAGE_PMD_ORDER);
    m.trace(|| Step::Suitable {
        orders: u32::from(suitable) << HPAGE_PMD_ORDER,
        unsuitable: u32::from(!suitable) << HPAGE_PMD_ORDER,
    });
    if !suitable {
        return Ok(PmdFault::Fallback);
    }
    mm.anon_vma_prepare(addr);
    crate::khugepaged::khugepaged_enter_vma(m, mm, vma);
    if !write && m.thp.use_zero_page {
        m.trace(|| Step::ZeroPage { huge: true });
        let deposit = m.pte_alloc_one()?;
        if mm_get_huge_zero_folio(m, mm).is_none() {
            m.pte_free(deposit);
            m.stat.count_vm_event(VmEvent::ThpFaultFallback);
            m.trace(|| Step::Fallback {
                order: HPAGE_PMD_ORDER,
                counters: vec![
                    Counted::Vm(VmEvent::ThpZeroPageAllocFailed),
                    Counted::Vm(VmEvent::ThpFaultFallback),
                ],
            });
            return Ok(PmdFault::Fallback);
        }
        mm.pmds.insert(haddr / PMD_SIZE, Pmd::HugeZero { deposit });
        return Ok(PmdFault::Done);
    }
    let Some(folio) = vma_alloc_anon_folio_pmd(m, mm, vma) else {
        return Ok(PmdFault::Fallback);
    };
    let deposit = match m.pte_alloc_one() {
        Ok(d) => d,
        Err(e) => {
            free_folio(m, folio);
            return Err(e);
        }
    };
    map_anon_folio_pmd(m, mm, vma, folio, haddr, deposit);
    Ok(PmdFault::Done)
}

/// vma_alloc_anon_folio_pmd: an order-9 folio, zeroed and charged to the
/// mm's memcg, or None after counting the fallback (and, when the charge
/// failed, the charge fallback too).
fn vma_alloc_anon_folio_pmd(m: &mut Machine, mm: &mut MmStruct, vma: &Vma) -> Option<Pfn> {
    let gfp = crate::gfp::vma_thp_gfp_mask(&m.thp, vma);
    let order = HPAGE_PMD_ORDER;
    let Some(folio) = crate::page_alloc::vma_alloc_folio(m, Some(&mut *mm), gfp, order) else {
        m.stat.count_vm_event(VmEvent::ThpFaultFallback);
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultFallback);
        m.trace(|| Step::Fallback {
            order,
            counters: vec![
                Counted::Vm(VmEvent::ThpFaultFallback),
                Counted::Mthp(MthpStat::AnonFaultFallback),
            ],
        });
        return None;
    };
    let mm_id = mm.mm_id;
    if crate::memcontrol::mem_cgroup_charge(m, Some(mm), mm_id, folio, order, gfp).is_err() {
        free_folio(m, folio);
        m.stat.count_vm_event(VmEvent::ThpFaultFallback);
        m.stat.count_vm_event(VmEvent::ThpFaultFallbackCharge);
        m.stat.count_mthp_stat(order, MthpStat::AnonFaultFallback);
        m.stat
            .count_mthp_stat(order, MthpStat::AnonFaultFallbackCharge);
        m.trace(|| Step::Fallback {
            order,
            counters: vec![
                Counted::Vm(VmEvent::ThpFaultFallback),
                Counted::Vm(VmEvent::ThpFaultFallbackCharge),
                Counted::Mthp(MthpStat::AnonFaultFallback),
                Counted::Mthp(MthpStat::AnonFaultFallbackCharge),
            ],
        });
        return None;
    }
    Some(folio)
}

/// map_anon_folio_pmd: installs a new exclusive THP, counts the fault and
/// queues the THP for the under-used shrinker.
fn map_anon_folio_pmd(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    folio: Pfn,
    haddr: u64,
    deposit: Pfn,
) {
    let writable = vma.flags & Vma::VM_WRITE != 0;
    rmap::folio_add_new_anon_rmap(m, folio, HPAGE_PMD_ORDER, true, mm.mm_id, haddr);
    crate::thp_utilization::set_folio_cause(m, folio, crate::thp_utilization::FolioCause::Fault);
    mm.anon_rss += HPAGE_PMD_NR;
    mm.pmds.insert(
        haddr / PMD_SIZE,
        Pmd::Huge {
            pfn: folio,
            writable,
            dirty: true,
            deposit,
        },
    );
    m.stat.count_vm_event(VmEvent::ThpFaultAlloc);
    m.trace(|| Step::Mapped {
        order: HPAGE_PMD_ORDER,
    });
    m.stat
        .count_mthp_stat(HPAGE_PMD_ORDER, MthpStat::AnonFaultAlloc);
    // A fresh PMD THP is a candidate for the underused shrinker, from either
    // fault path: the 6.18 stable updates since December 2025 carry upstream
    // 2a1351cd ("mm/huge_memory: add pmd folio to ds_queue in
    // do_huge_zero_wp_pmd()"), which moved the queueing here from
    // __do_huge_pmd_anonymous_page (the kernel backend's 6.18.44 has it).
    deferred_split_folio(m, folio, false);
}

/// do_huge_zero_wp_pmd: a write to the huge zero page. Allocates a THP for the
/// whole range (6.13+); when that fails, splits the zero PMD so the write is
/// retried at the PTE level.
pub fn do_huge_zero_wp_pmd(
    m: &mut Machine,
    mm: &mut MmStruct,
    vma: &Vma,
    addr: u64,
) -> Result<PmdFault, Fault> {
    let haddr = addr & !(PMD_SIZE - 1);
    let Some(Pmd::HugeZero { deposit }) = mm.pmds.get(&(haddr / PMD_SIZE)) else {
        unreachable!("do_huge_zero_wp_pmd on a PMD that is not the huge zero page");
    };
    let deposit = *deposit;
    m.trace(|| Step::Wp {
        huge: true,
        zero: true,
        reused: false,
    });
    match vma_alloc_anon_folio_pmd(m, mm, vma) {
        Some(folio) => {
            // Queued for the under-used shrinker by map_anon_folio_pmd (the
            // first 6.18 releases, before upstream 2a1351cd, did not).
            map_anon_folio_pmd(m, mm, vma, folio, haddr, deposit);
            Ok(PmdFault::Done)
        }
        None => {
            split_huge_pmd(m, mm, haddr);
            Ok(PmdFault::Fallback)
        }
    }
}

/// do_huge_pmd_wp_page: a write to a write-protected PMD-mapped THP (after
/// fork). Reused in place when exclusive (PageAnonExclusive on the head, or
/// only the PMD's own reference left); otherwise the PMD is split and the
/// write retried at the PTE level, where do_wp_page copies the one page.
pub fn do_huge_pmd_wp_page(m: &mut Machine, mm: &mut MmStruct, addr: u64) -> PmdFault {
    let index = addr / PMD_SIZE;
    let Some(Pmd::Huge { pfn, .. }) = mm.pmds.get(&index) else {
        unreachable!("do_huge_pmd_wp_page on a PMD that is not a THP");
    };
    let folio = *pfn;
    let exclusive = m.zone.memmap.page(folio).test(pg::ANON_EXCLUSIVE);
    if exclusive || rmap::folio_ref_count(m, folio) == 1 {
        m.zone.memmap.page_mut(folio).set(pg::ANON_EXCLUSIVE);
        if let Some(Pmd::Huge { writable, .. }) = mm.pmds.get_mut(&index) {
            *writable = true;
        }
        m.trace(|| Step::Wp {
            huge: true,
            zero: false,
            reused: true,
        });
        return PmdFault::Done;
    }
    m.trace(|| Step::Wp {
        huge: true,
        zero: false,
        reused: false,
    });
    split_huge_pmd(m, mm, index * PMD_SIZE);
    PmdFault::Fallback
}

/// copy_huge_pmd: fork shares a PMD mapping with the child, write-protected
/// on both sides, with a page table deposited for the child. A THP that
/// the parent may have pinned is not shared: the parent's PMD is split and
/// the caller copies the range PTE by PTE (-EAGAIN), which copies the
/// exclusive pages.
pub fn copy_huge_pmd(
    m: &mut Machine,
    dst: &mut MmStruct,
    src: &mut MmStruct,
    index: u64,
) -> Result<PmdFault, Fault> {
    let pgtable = m.pte_alloc_one()?;
    match src.pmds.get(&index) {
        Some(Pmd::HugeZero { .. }) => {
            // Never allocates: the parent holds the folio.
            mm_get_huge_zero_folio(m, dst);
            dst.pmds.insert(index, Pmd::HugeZero { deposit: pgtable });
            Ok(PmdFault::Done)
        }
        Some(Pmd::Huge { pfn, dirty, .. }) => {
            let (folio, dirty) = (*pfn, *dirty);
            let maybe_pinned = src.has_pinned && rmap::folio_maybe_dma_pinned(m, folio);
            if rmap::folio_try_dup_anon_rmap_pmd(m, folio, dst.mm_id, src.mm_id, maybe_pinned)
                .is_err()
            {
                m.pte_free(pgtable);
                split_huge_pmd(m, src, index * PMD_SIZE);
                return Ok(PmdFault::Fallback);
            }
            if let Some(Pmd::Huge { writable, .. }) = src.pmds.get_mut(&index) {
                *writable = false;
            }
            dst.anon_rss += HPAGE_PMD_NR;
            dst.pmds.insert(
                index,
                Pmd::Huge {
                    pfn: folio,
                    writable: false,
                    dirty,
                    deposit: pgtable,
                },
            );
            Ok(PmdFault::Done)
        }
        _ => unreachable!("copy_huge_pmd on a PMD that is not huge"),
    }
}

/// mm_get_huge_zero_folio: the shared huge zero folio, allocated on first use;
/// each mm that maps it holds one reference (MMF_HUGE_ZERO_FOLIO).
fn mm_get_huge_zero_folio(m: &mut Machine, mm: &mut MmStruct) -> Option<Pfn> {
    if mm.huge_zero_ref {
        return m.huge_zero_folio;
    }
    let folio = match m.huge_zero_folio {
        Some(folio) => folio,
        // GFP_TRANSHUGE & ~__GFP_MOVABLE.
        None => match m
            .zone
            .alloc_pages_mt(HPAGE_PMD_ORDER, crate::page_alloc::MigrateType::Unmovable)
        {
            Some(folio) => {
                m.stat.count_vm_event(VmEvent::ThpZeroPageAlloc);
                m.huge_zero_folio = Some(folio);
                m.huge_zero_refcount = 1; // the shrinker's base reference
                folio
            }
            None => {
                m.stat.count_vm_event(VmEvent::ThpZeroPageAllocFailed);
                return None;
            }
        },
    };
    m.huge_zero_refcount += 1;
    mm.huge_zero_ref = true;
    Some(folio)
}

/// mm_put_huge_zero_folio, at exit of an mm that mapped it.
pub fn mm_put_huge_zero_folio(m: &mut Machine, mm: &mut MmStruct) {
    if std::mem::take(&mut mm.huge_zero_ref) {
        m.huge_zero_refcount -= 1;
    }
}

/// shrink_huge_zero_folio_scan: frees the huge zero folio when no mm maps
/// it any more (only the shrinker's own reference is left); the next huge
/// zero fault allocates it again (thp_zero_page_alloc).
pub fn shrink_huge_zero_folio_scan(m: &mut Machine) {
    if m.huge_zero_refcount == 1 {
        if let Some(folio) = m.huge_zero_folio.take() {
            m.huge_zero_refcount = 0;
            m.zone.free_pages(folio, HPAGE_PMD_ORDER);
        }
    }
}

/// split_huge_pmd at `haddr`: the PMD becomes a table of PTEs mapping the same
/// folio (or the zero page). The folio itself is not split and stays whole.
pub fn split_huge_pmd(m: &mut Machine, mm: &mut MmStruct, haddr: u64) {
    let index = haddr / PMD_SIZE;
    let Some(pmd) = mm.pmds.remove(&index) else {
        return;
    };
    let table = match pmd {
        Pmd::Table(table) => table,
        Pmd::HugeZero { deposit } => {
            let mut table = PteTable::new(deposit);
            table.ptes.fill(Pte::ZERO);
            m.stat.count_vm_event(VmEvent::ThpSplitPmd);
            table
        }
        Pmd::Huge {
            pfn,
            writable,
            dirty,
            deposit,
        } => {
            let mut table = PteTable::new(deposit);
            for (i, pte) in table.ptes.iter_mut().enumerate() {
                *pte = Pte::new(Pfn(pfn.0 + i as u64), writable);
            }
            if dirty {
                // __split_huge_pmd_locked: a dirty PMD dirties the folio.
                crate::swap::folio_mark_dirty(m, pfn);
            } else {
                table.pte_mkclean(0, crate::mm_types::PTRS_PER_PTE);
            }
            // The head's PageAnonExclusive speaks for the PMD mapping; the
            // PTEs inherit it page by page.
            let exclusive = m.zone.memmap.page(pfn).test(pg::ANON_EXCLUSIVE);
            rmap::folio_add_anon_rmap_ptes(m, pfn, pfn, HPAGE_PMD_NR, mm.mm_id, exclusive);
            // Not the last reference: the PTEs just took theirs.
            rmap::folio_remove_rmap_pmd(m, pfn, mm.mm_id);
            m.stat.count_vm_event(VmEvent::ThpSplitPmd);
            table
        }
    };
    mm.pmds.insert(index, Pmd::Table(table));
}

/// The deferred split queue (one per node; the model has one node and no memcg).
/// Ordered by when a folio was queued, like the kernel's list.
#[derive(Default)]
pub struct DeferredSplitQueue {
    list: BTreeMap<u64, Pfn>,
    position: HashMap<Pfn, u64>,
    next: u64,
}

impl DeferredSplitQueue {
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The queued folios, oldest first.
    pub fn iter(&self) -> impl Iterator<Item = Pfn> + '_ {
        self.list.values().copied()
    }

    /// Takes these folios off the queue (a memcg's part of it).
    pub(crate) fn remove_all(&mut self, folios: &[Pfn]) {
        for &folio in folios {
            self.remove(folio);
        }
    }

    pub(crate) fn add_tail(&mut self, folio: Pfn) {
        self.list.insert(self.next, folio);
        self.position.insert(folio, self.next);
        self.next += 1;
    }

    fn remove(&mut self, folio: Pfn) {
        if let Some(seq) = self.position.remove(&folio) {
            self.list.remove(&seq);
        }
    }

    /// A queued folio moved (compaction migrated it): it keeps its place.
    pub(crate) fn replace(&mut self, old: Pfn, new: Pfn) {
        if let Some(seq) = self.position.remove(&old) {
            self.list.insert(seq, new);
            self.position.insert(new, seq);
        }
    }

    /// Takes every queued folio off the queue, oldest first.
    pub fn drain(&mut self) -> Vec<Pfn> {
        self.position.clear();
        std::mem::take(&mut self.list).into_values().collect()
    }
}

/// thp_underused: more zero-filled subpages than max_ptes_none allows
/// (max_ptes_none = 511 turns the check off).
pub fn thp_underused(m: &Machine, folio: Pfn) -> bool {
    let max_none = m.thp.khugepaged.max_ptes_none;
    if max_none >= HPAGE_PMD_NR - 1 {
        return false;
    }
    let nr = 1u64 << m.zone.memmap.page(folio).order();
    let zero = m
        .zone
        .memmap
        .pages(folio, nr)
        .iter()
        .filter(|p| p.test(pg::ZEROED))
        .count() as u64;
    zero > max_none
}

/// split_folio (split_huge_page_to_list_to_order to order 0) of an anonymous
/// folio: unmap_folio's walk (`rmap::try_to_migrate`) may queue it as
/// partially mapped on the way (split_deferred; the split takes it off the
/// queue again); its PMD mappings are split (thp_split_pmd), then every page
/// becomes a folio of its own, keeping its PTE mappings; pages no longer
/// mapped are freed. Zero-filled pages are mapped to the shared zero page
/// instead and freed: `__folio_split` passes RMP_USE_SHARED_ZEROPAGE to
/// remap_page after every successful anon split, so
/// try_to_map_unused_to_zeropage runs for each mapped subpage, whichever
/// path asked for the split. Fails, counting thp_split_page_failed and the
/// size's split_failed, when someone holds a reference that no mapping
/// explains (can_split_folio: a pin); returns whether it split.
pub fn split_folio(m: &mut Machine, mms: &mut MmList, folio: Pfn) -> bool {
    let order = m.zone.memmap.page(folio).order();
    let nr = 1u64 << order;
    if !rmap::folio_refs_all_mappings(m, folio) {
        if order == HPAGE_PMD_ORDER {
            m.stat.count_vm_event(VmEvent::ThpSplitPageFailed);
        }
        m.stat.count_mthp_stat(order, MthpStat::SplitFailed);
        return false;
    }
    // unmap_folio: the kernel's walk unmaps the folio mapping by mapping,
    // which may queue it as partially mapped for a moment.
    rmap::try_to_migrate(m, mms, folio);
    // The mappings are found through the folio's anon_vma and index: the
    // one place in each mm of its fork family where its pages can be.
    let (walk, addr) = rmap::rmap_walk_anon(m, folio);
    let index = addr / PMD_SIZE;
    if rmap::folio_entire_mapcount(m, folio) > 0 {
        for &id in &walk {
            let Some(mm) = mms.get_mut(id) else { continue };
            if matches!(mm.pmds.get(&index), Some(Pmd::Huge { pfn, .. }) if *pfn == folio) {
                split_huge_pmd(m, mm, addr);
            }
        }
    }
    // The new order-0 folios have no MM-ID slots: a stale entry would make a
    // large folio later allocated here look shared.
    m.folio_mm_ids.remove(&folio);
    let any_zeroed = m
        .zone
        .memmap
        .pages(folio, nr)
        .iter()
        .any(|p| p.test(pg::ZEROED));
    if any_zeroed {
        let first = crate::pgtable::pte_index(addr);
        for &id in &walk {
            let Some(mm) = mms.get_mut(id) else { continue };
            let Some(Pmd::Table(t)) = mm.pmds.get_mut(&index) else {
                continue;
            };
            let mut dropped = 0u64;
            for (i, pte) in t.ptes[first..first + nr as usize].iter_mut().enumerate() {
                let pfn = Pfn(folio.0 + i as u64);
                if pte.pfn() != Some(pfn) {
                    continue;
                }
                let page = m.zone.memmap.page_mut(pfn);
                if page.test(pg::ZEROED) {
                    *pte = Pte::ZERO;
                    page.mapcount -= 1;
                    m.stat.nr_anon_mapped -= i64::from(page.mapcount == 0);
                    dropped += 1;
                }
            }
            mm.anon_rss -= dropped;
        }
    }
    let anon_vma = m.zone.memmap.folio_ext(folio).anon_vma;
    m.anon_vmas.put_folio(anon_vma);
    if order == HPAGE_PMD_ORDER {
        m.stat.count_vm_event(VmEvent::ThpSplitPage);
    }
    m.stat.count_mthp_stat(order, MthpStat::Split);
    m.stat.mod_mthp_stat(order, MthpStat::NrAnon, -1);
    folio_unqueue_deferred_split(m, folio, order);
    // Off the queue already when the shrinker splits it, but still flagged.
    let head = m.zone.memmap.page_mut(folio);
    if head.test(pg::PARTIALLY_MAPPED) {
        head.clear(pg::PARTIALLY_MAPPED);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, -1);
    }
    // The new folios inherit the head's LRU flags (see swap), PG_dirty
    // included, which splitting a dirty PMD mapping above may have set.
    let lru = m.lru.get(folio);
    m.lru.forget(folio);
    crate::memcontrol::split_page_memcg(m, folio, nr);
    for i in 0..nr {
        let pfn = Pfn(folio.0 + i);
        let page = m.zone.memmap.page_mut(pfn);
        // The pieces keep their content and whether the workload wrote
        // them; the head's cause goes (order-0 folios have none).
        let keep = [pg::ANON, pg::ANON_EXCLUSIVE, pg::ZEROED, pg::WRITTEN]
            .into_iter()
            .filter(|f| page.test(*f))
            .fold(0, |a, f| a | f);
        let mapcount = page.mapcount;
        page.init(pg::HEAD | keep, 0);
        page.mapcount = mapcount;
        // Each PTE mapping holds a reference on the page's new folio.
        page.private = u32::from(mapcount);
        if mapcount == 0 {
            crate::memcontrol::mem_cgroup_uncharge(m, pfn);
            m.zone.free_pages(pfn, 0);
        } else {
            crate::swap::split_folio_lru(m, lru, pfn, i);
        }
    }
    true
}

/// split_huge_pages_pid: what writing `pid,start,end` to debugfs
/// `split_huge_pages` does to the process whose mm id is `target`. Walks the range a page
/// at a time (a THP is met again at each of its pages, and skipped once split);
/// the walk ends at the first address no VMA covers. A large folio that
/// can_split_folio refuses (a pin) is skipped without a split attempt, so
/// nothing is counted for it. Returns (large folios met, folios split), the
/// "split of total" the kernel logs.
pub fn split_huge_pages_pid(
    m: &mut Machine,
    mms: &mut MmList,
    target: crate::rmap::MmId,
    start: u64,
    end: u64,
) -> (u64, u64) {
    let (mut total, mut split) = (0, 0);
    let mut addr = start & !(PAGE_SIZE - 1);
    let end = end & !(PAGE_SIZE - 1);
    while addr < end {
        let mm = mms.get_mut(target).expect("the target mm");
        if mm.find_vma(addr).is_none() {
            break;
        }
        let page = crate::gup::follow_page(mm, addr);
        addr += PAGE_SIZE;
        let Some(page) = page else { continue };
        let folio = page_folio(m, page);
        if m.zone.memmap.page(folio).order() == 0 {
            continue;
        }
        total += 1;
        if !rmap::folio_refs_all_mappings(m, folio) {
            continue;
        }
        split += u64::from(split_folio(m, mms, folio));
    }
    (total, split)
}

/// deferred_split_folio: queue a large anon folio, either because it became
/// partially mapped or (PMD THPs at fault) as a candidate for the underused shrinker.
pub fn deferred_split_folio(m: &mut Machine, folio: Pfn, partially_mapped: bool) {
    let order = m.zone.memmap.page(folio).order();
    if order <= 1 || (!partially_mapped && !m.thp.shrink_underused) {
        return;
    }
    let head = m.zone.memmap.page_mut(folio);
    if partially_mapped && !head.test(pg::PARTIALLY_MAPPED) {
        head.set(pg::PARTIALLY_MAPPED);
        if order == HPAGE_PMD_ORDER {
            m.stat.count_vm_event(VmEvent::ThpDeferredSplitPage);
        }
        m.stat.count_mthp_stat(order, MthpStat::SplitDeferred);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, 1);
    }
    let head = m.zone.memmap.page_mut(folio);
    if !head.test(pg::DEFERRED) {
        head.set(pg::DEFERRED);
        m.deferred_split_queue.add_tail(folio);
    }
}

/// folio_unqueue_deferred_split, when a folio is freed.
pub fn folio_unqueue_deferred_split(m: &mut Machine, folio: Pfn, order: u32) {
    let head = m.zone.memmap.page_mut(folio);
    if !head.test(pg::DEFERRED) {
        return;
    }
    head.clear(pg::DEFERRED);
    if head.test(pg::PARTIALLY_MAPPED) {
        head.clear(pg::PARTIALLY_MAPPED);
        m.stat
            .mod_mthp_stat(order, MthpStat::NrAnonPartiallyMapped, -1);
    }
    m.deferred_split_queue.remove(folio);
}

/// deferred_split_scan: every queued folio leaves the queue. A partially
/// mapped one is split; one that is not is split only if thp_underused
/// (then thp_underused_split_page), else it is simply dropped from the
/// queue: the under-used check is made once. A partially mapped folio whose
/// split fails (pinned) goes back to the tail of the queue.
pub fn deferred_split_scan(m: &mut Machine, mms: &mut MmList) {
    let folios = m.deferred_split_queue.drain();
    deferred_split_scan_folios(m, mms, folios);
}

/// deferred_split_scan's walk over `folios`, taken off the queue already.
///
/// No kernel function: deferred_split_scan's second loop, shared with the memcg queue's scan.
pub(crate) fn deferred_split_scan_folios(m: &mut Machine, mms: &mut MmList, folios: Vec<Pfn>) {
    for folio in folios {
        m.zone.memmap.page_mut(folio).clear(pg::DEFERRED);
        let partially_mapped = m.zone.memmap.page(folio).test(pg::PARTIALLY_MAPPED);
        let underused = !partially_mapped && thp_underused(m, folio);
        if !partially_mapped && !underused {
            continue;
        }
        if split_folio(m, mms, folio) {
            if underused {
                m.stat.count_vm_event(VmEvent::ThpUnderusedSplitPage);
            }
        } else if partially_mapped {
            m.zone.memmap.page_mut(folio).set(pg::DEFERRED);
            m.deferred_split_queue.add_tail(folio);
        }
    }
}

/// The `split` statement: `pid,start,end` written to debugfs
/// `split_huge_pages` (`split_huge_pages_write`); the splits' rmap walks
/// reach every mm.
pub fn sys_split(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range_no_hugetlb(m, stmt, proc, range)?;
    m.with_mms(None, |m, mms| split_huge_pages_pid(m, mms, id, start, end));
    Ok(())
}

/// The `thp_disable` statement: prctl(PR_SET_THP_DISABLE) sets or clears
/// MMF_DISABLE_THP_COMPLETELY on the process's mm (kernel/sys.c).
pub fn sys_prctl_thp_disable(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    on: bool,
) -> Result<(), BackendError> {
    let id = mm_id_of(m, stmt, proc)?;
    m.mms.get_mut(id).expect("a task's mm").thp_disabled = on;
    Ok(())
}

#[cfg(test)]
mod tests {

    /// Under-used splits at reclaim after writing `pages` pages of one THP,
    /// with max_ptes_none 409.
    fn underused_splits(pages: u64) -> i64 {
        let text = format!(
            "set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/khugepaged/max_ptes_none 409\n\
             spawn a\n\
             a mmap buf 2M align=2M\n\
             a madvise buf HUGEPAGE\n\
             a write buf:{}K\n\
             reclaim\n",
            pages * 4
        );
        crate::end_counters(&text)["vmstat.thp_underused_split_page"]
    }

    #[test]
    fn underused_means_more_zero_pages_than_max_ptes_none() {
        // 512 - pages zero-filled pages: split iff that is > 409.
        assert_eq!(underused_splits(102), 1); // 410 zero pages
        assert_eq!(underused_splits(103), 0); // 409 zero pages
        assert_eq!(underused_splits(512), 0);
    }
}
