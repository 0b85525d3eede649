//! The THP settings and the order helpers every THP path asks: which orders
//! a VMA may use and which fit at an address.
//!
//! Follows Linux 6.18 `include/linux/huge_mm.h` (`thp_vma_allowable_orders`,
//! `thp_vma_suitable_order(s)`, `highest_order`, `vma_thp_disabled`, the
//! `huge_anon_orders_*` bitmaps the sysfs controls fill) with
//! `__thp_vma_allowable_orders` from `mm/huge_memory.c`. A header: the
//! fault, khugepaged, fork and reporting paths all need these and nothing
//! above them.

use crate::mm_types::{MmStruct, Vma, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use hugelab_workload::{ThpDefrag, ThpEnabled, ThpSizeEnabled};

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
    // A file VMA's huge orders are its file's (shmem_allowable_huge_orders
    // for the kernel backend's memfds), none while shmem_enabled is never
    // (the only setting the model has; see filemap): anonymous THP does not
    // apply to it, at fault, khugepaged or MADV_COLLAPSE.
    if vma.hugetlb.is_some() || vma.file.is_some() {
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
