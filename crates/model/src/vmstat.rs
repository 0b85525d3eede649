//! Event and state counters, by the kernel's names.
//!
//! Follows Linux 6.18 `include/linux/vm_event_item.h` (events), `mm/vmstat.c`
//! (node stats shown in /proc/vmstat) and `mm/huge_memory.c` (per-size mTHP stats
//! under hugepages-<size>kB/stats/). Only what the model drives is here: a
//! counter the model does not maintain is not reported at all. The names are the registry's
//! (`hugelab_workload::counters`); a test checks every one is there.
//!
//! Beside them, one observation that is no kernel counter: the sum over
//! every mm of MM_ANONPAGES (`rss_anon`) and its watermark with the machine
//! at that moment (`AnonPeak`), which `hugelab predict` reads as the peak
//! of anonymous memory as the processes map it.

use crate::mm_types::HPAGE_PMD_ORDER;

/// vm_event_item entries the model counts, in /proc/vmstat spelling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmEvent {
    PgFault,
    ThpFaultAlloc,
    ThpFaultFallback,
    ThpSplitPmd,
    ThpDeferredSplitPage,
    ThpZeroPageAlloc,
    ThpZeroPageAllocFailed,
    ThpCollapseAlloc,
    ThpCollapseAllocFailed,
    ThpScanExceedNonePte,
    ThpScanExceedSharePte,
    ThpSplitPage,
    ThpSplitPageFailed,
    ThpUnderusedSplitPage,
    PgDeactivate,
    PgLazyfree,
    PgLazyfreed,
    ThpSwpoutFallback,
    /// mm/compaction.c and mm/migrate.c (CONFIG_COMPACTION, CONFIG_MIGRATION).
    CompactMigrateScanned,
    CompactFreeScanned,
    CompactIsolated,
    CompactStall,
    CompactFail,
    CompactSuccess,
    CompactDaemonWake,
    CompactDaemonMigrateScanned,
    CompactDaemonFreeScanned,
    PgmigrateSuccess,
    PgmigrateFail,
    ThpFaultFallbackCharge,
    OomKill,
}

impl VmEvent {
    pub const ALL: [VmEvent; 31] = [
        VmEvent::PgFault,
        VmEvent::ThpFaultAlloc,
        VmEvent::ThpFaultFallback,
        VmEvent::ThpSplitPmd,
        VmEvent::ThpDeferredSplitPage,
        VmEvent::ThpZeroPageAlloc,
        VmEvent::ThpZeroPageAllocFailed,
        VmEvent::ThpCollapseAlloc,
        VmEvent::ThpCollapseAllocFailed,
        VmEvent::ThpScanExceedNonePte,
        VmEvent::ThpScanExceedSharePte,
        VmEvent::ThpSplitPage,
        VmEvent::ThpSplitPageFailed,
        VmEvent::ThpUnderusedSplitPage,
        VmEvent::PgDeactivate,
        VmEvent::PgLazyfree,
        VmEvent::PgLazyfreed,
        VmEvent::ThpSwpoutFallback,
        VmEvent::CompactMigrateScanned,
        VmEvent::CompactFreeScanned,
        VmEvent::CompactIsolated,
        VmEvent::CompactStall,
        VmEvent::CompactFail,
        VmEvent::CompactSuccess,
        VmEvent::CompactDaemonWake,
        VmEvent::CompactDaemonMigrateScanned,
        VmEvent::CompactDaemonFreeScanned,
        VmEvent::PgmigrateSuccess,
        VmEvent::PgmigrateFail,
        VmEvent::ThpFaultFallbackCharge,
        VmEvent::OomKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            VmEvent::PgFault => "pgfault",
            VmEvent::ThpFaultAlloc => "thp_fault_alloc",
            VmEvent::ThpFaultFallback => "thp_fault_fallback",
            VmEvent::ThpSplitPmd => "thp_split_pmd",
            VmEvent::ThpDeferredSplitPage => "thp_deferred_split_page",
            VmEvent::ThpZeroPageAlloc => "thp_zero_page_alloc",
            VmEvent::ThpZeroPageAllocFailed => "thp_zero_page_alloc_failed",
            VmEvent::ThpCollapseAlloc => "thp_collapse_alloc",
            VmEvent::ThpCollapseAllocFailed => "thp_collapse_alloc_failed",
            VmEvent::ThpScanExceedNonePte => "thp_scan_exceed_none_pte",
            VmEvent::ThpScanExceedSharePte => "thp_scan_exceed_share_pte",
            VmEvent::ThpSplitPage => "thp_split_page",
            VmEvent::ThpSplitPageFailed => "thp_split_page_failed",
            VmEvent::ThpUnderusedSplitPage => "thp_underused_split_page",
            VmEvent::PgDeactivate => "pgdeactivate",
            VmEvent::PgLazyfree => "pglazyfree",
            VmEvent::PgLazyfreed => "pglazyfreed",
            VmEvent::ThpSwpoutFallback => "thp_swpout_fallback",
            VmEvent::CompactMigrateScanned => "compact_migrate_scanned",
            VmEvent::CompactFreeScanned => "compact_free_scanned",
            VmEvent::CompactIsolated => "compact_isolated",
            VmEvent::CompactStall => "compact_stall",
            VmEvent::CompactFail => "compact_fail",
            VmEvent::CompactSuccess => "compact_success",
            VmEvent::CompactDaemonWake => "compact_daemon_wake",
            VmEvent::CompactDaemonMigrateScanned => "compact_daemon_migrate_scanned",
            VmEvent::CompactDaemonFreeScanned => "compact_daemon_free_scanned",
            VmEvent::PgmigrateSuccess => "pgmigrate_success",
            VmEvent::PgmigrateFail => "pgmigrate_fail",
            VmEvent::ThpFaultFallbackCharge => "thp_fault_fallback_charge",
            VmEvent::OomKill => "oom_kill",
        }
    }
}

/// Per-size stats (`enum mthp_stat_item`) the model counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MthpStat {
    AnonFaultAlloc,
    AnonFaultFallback,
    SplitDeferred,
    Split,
    SplitFailed,
    SwpoutFallback,
    /// Gauge.
    NrAnon,
    /// Gauge.
    NrAnonPartiallyMapped,
    AnonFaultFallbackCharge,
}

impl MthpStat {
    pub const ALL: [MthpStat; 9] = [
        MthpStat::AnonFaultAlloc,
        MthpStat::AnonFaultFallback,
        MthpStat::SplitDeferred,
        MthpStat::Split,
        MthpStat::SplitFailed,
        MthpStat::SwpoutFallback,
        MthpStat::NrAnon,
        MthpStat::NrAnonPartiallyMapped,
        MthpStat::AnonFaultFallbackCharge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            MthpStat::AnonFaultAlloc => "anon_fault_alloc",
            MthpStat::AnonFaultFallback => "anon_fault_fallback",
            MthpStat::SplitDeferred => "split_deferred",
            MthpStat::Split => "split",
            MthpStat::SplitFailed => "split_failed",
            MthpStat::SwpoutFallback => "swpout_fallback",
            MthpStat::NrAnon => "nr_anon",
            MthpStat::NrAnonPartiallyMapped => "nr_anon_partially_mapped",
            MthpStat::AnonFaultFallbackCharge => "anon_fault_fallback_charge",
        }
    }
}

/// One counter a step raised (the fault trace's `Fallback`): a vm event,
/// or a per-size stat of the step's order. Serialized as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Counted {
    Vm(VmEvent),
    Mthp(MthpStat),
}

impl Counted {
    pub fn name(self) -> &'static str {
        match self {
            Counted::Vm(e) => e.name(),
            Counted::Mthp(s) => s.name(),
        }
    }
}

impl serde::Serialize for Counted {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

const NR_ORDERS: usize = HPAGE_PMD_ORDER as usize + 1;

#[derive(Clone, Debug, Default)]
pub struct VmStat {
    events: [u64; VmEvent::ALL.len()],
    mthp: [[i64; MthpStat::ALL.len()]; NR_ORDERS],
    /// NR_ANON_MAPPED: anon pages mapped by at least one PTE or PMD.
    pub nr_anon_mapped: i64,
    /// NR_ANON_THPS, in pages: pages of anon folios with at least one PMD mapping.
    pub nr_anon_thps: i64,
    /// NR_PAGETABLE: page-table pages (PTE tables, including deposited ones).
    pub nr_pagetable: i64,
    /// khugepaged_pages_collapsed (transparent_hugepage/khugepaged/pages_collapsed).
    pub khugepaged_pages_collapsed: u64,
    /// The sum over every mm of MM_ANONPAGES (each process's RssAnon, in
    /// pages): a page mapped by two processes counts twice. Not a kernel
    /// counter; kept beside each `anon_rss` change so its peak is a
    /// watermark, not a scan.
    pub rss_anon: u64,
    /// The machine at the moment `rss_anon` was highest (the first such
    /// moment): see [`AnonPeak`].
    pub anon_peak: AnonPeak,
}

/// The model-only observation of the moment of most anonymous memory as the
/// processes map it: the peak of the sum of RssAnon, and NR_ANON_MAPPED,
/// NR_ANON_THPS and each size's anonymous folios (`nr_anon`) at that moment.
/// Raised where `rss_anon` grows, so it costs a compare per fault and a copy
/// of a few counters when the peak moves.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AnonPeak {
    /// Pages: the highest `rss_anon` so far.
    pub rss_anon: u64,
    /// NR_ANON_MAPPED then, in pages.
    pub anon_mapped: i64,
    /// NR_ANON_THPS then, in pages (AnonHugePages).
    pub anon_thps: i64,
    /// `nr_anon` of each order then (orders 0 and 1 stay 0, as in the kernel).
    pub nr_anon: [i64; NR_ORDERS],
}

impl VmStat {
    #[inline]
    pub fn count_vm_event(&mut self, event: VmEvent) {
        self.events[event as usize] += 1;
    }

    /// count_vm_events.
    #[inline]
    pub fn count_vm_events(&mut self, event: VmEvent, n: u64) {
        self.events[event as usize] += n;
    }

    pub fn event(&self, event: VmEvent) -> u64 {
        self.events[event as usize]
    }

    /// count_mthp_stat: ignores order 0 and orders above PMD, like the kernel.
    #[inline]
    pub fn count_mthp_stat(&mut self, order: u32, item: MthpStat) {
        self.mod_mthp_stat(order, item, 1);
    }

    #[inline]
    pub fn mod_mthp_stat(&mut self, order: u32, item: MthpStat, delta: i64) {
        if order == 0 || order > HPAGE_PMD_ORDER {
            return;
        }
        self.mthp[order as usize][item as usize] += delta;
    }

    pub fn mthp_stat(&self, order: u32, item: MthpStat) -> i64 {
        self.mthp[order as usize][item as usize]
    }

    /// add_mm_counter(mm, MM_ANONPAGES, nr) (include/linux/mm.h) on the
    /// mm's `anon_rss`, with the sum over every mm kept beside it: it
    /// grows, and the peak with it.
    #[inline]
    pub fn add_mm_anon(&mut self, anon_rss: &mut u64, nr: u64) {
        *anon_rss += nr;
        self.rss_anon += nr;
        if self.rss_anon > self.anon_peak.rss_anon {
            let mut nr_anon = [0; NR_ORDERS];
            for (order, n) in nr_anon.iter_mut().enumerate() {
                *n = self.mthp[order][MthpStat::NrAnon as usize];
            }
            self.anon_peak = AnonPeak {
                rss_anon: self.rss_anon,
                anon_mapped: self.nr_anon_mapped,
                anon_thps: self.nr_anon_thps,
                nr_anon,
            };
        }
    }

    /// add_mm_counter(mm, MM_ANONPAGES, -nr), the sum with it.
    #[inline]
    pub fn sub_mm_anon(&mut self, anon_rss: &mut u64, nr: u64) {
        debug_assert!(self.rss_anon >= nr, "the sum of RssAnon would go negative");
        *anon_rss -= nr;
        self.rss_anon -= nr;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counters::size_name;
    use hugelab_workload::counters::lookup;

    #[test]
    fn every_name_is_in_the_registry() {
        for e in VmEvent::ALL {
            assert!(lookup(&format!("vmstat.{}", e.name())).is_some(), "{e:?}");
        }
        for s in MthpStat::ALL {
            let name = format!("mthp.{}.{}", size_name(4), s.name());
            assert!(lookup(&name).is_some(), "{name}");
        }
    }
}
