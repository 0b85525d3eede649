//! Memory cgroups: `cgroup <cg> [memory.max=<size>]` and `spawn p
//! cgroup=<cg>`. Every anonymous folio is charged to its process's memcg
//! when a fault, a copy-on-write, fork or a collapse allocates it, and
//! uncharged when it is freed; a charge over `memory.max` runs limit
//! reclaim, and when nothing can be reclaimed, fails (a large folio: the
//! fault falls back to the next order) or calls the memcg OOM killer
//! (order-0 and other cheap charges).
//!
//! Follows Linux 6.18 `mm/memcontrol.c` (`mem_cgroup_margin`,
//! `memcg_memory_event`, `commit_charge`, `memcg_kmem_charge_page`,
//! `split_page_memcg`, `mem_cgroup_uncharge`, `mem_cgroup_migrate`) and
//! `mm/page_counter.c` (`page_counter_try_charge`, `page_counter_charge`,
//! `page_counter_uncharge`, the watermark that is memory.peak). This is the
//! counting half, which the free, split and migration paths call; the
//! charge of a new folio, whose limit reclaim and OOM kill call down into
//! them, is `memcontrol_charge` (`mem_cgroup_charge`, `try_charge_memcg`,
//! `mem_cgroup_oom`), the limit reclaim `vmscan`
//! (`try_to_free_mem_cgroup_pages`: without swap no anonymous page on the
//! LRU can be reclaimed, but lazily-freed folios can, and shrink_slab runs
//! the memcg-aware shrinkers, of which the deferred split shrinker is the
//! one that frees anonymous memory: `deferred_split_scan` on the memcg's own
//! queue, `get_deferred_split_queue`), the killer `oom_kill`.
//!
//! Simplifications:
//! - one level of groups below the root (the language has no nesting); the
//!   root is not a group: a process spawned without `cgroup=` charges
//!   nothing; cgroup v1's memsw counter and v2's memory.high, memory.low and
//!   memory.swap.* are not modelled;
//! - no per-cpu charge stock (`MEMCG_CHARGE_BATCH`): every charge goes to
//!   the page counter at once, so `drain_all_stock` has nothing to drain;
//!   the kernel's memory.current reads up to 64 pages per CPU above the
//!   model's (the registry's bound for `diff`);
//! - kernel memory: page-table pages are charged (GFP_PGTABLE_USER has
//!   __GFP_ACCOUNT) to the memcg of the process whose statement runs, and
//!   always succeed (`page_counter_charge`, where the kernel's charge may
//!   fail and end in VM_FAULT_OOM); slab objects (VMAs, anon_vmas) are not
//!   modelled and not charged;
//! - the memcg's deferred split queue is the machine's queue restricted to
//!   the folios charged to it (the same folios in the same order);
//!   `try_to_free_mem_cgroup_pages` discards lazily-freed folios first and
//!   scans that queue once when they fall short of nr_to_reclaim, where the
//!   kernel walks LRU and shrinkers together at falling priorities (the
//!   shrinker's scan count reaches a few queued folios only at the lowest
//!   ones);
//! - HugeTLB pages are not charged (memory_hugetlb_accounting is off by
//!   default, and v1 never charges them), nor is the huge zero folio;
//! - without swap, reclaim frees only what the shrinker splits off and what
//!   MADV_FREE left lazily free; with swap it would also swap out anonymous
//!   folios (and THPs whole, `thp_swpout`); there is no kswapd and no
//!   watermark, so memory.high and the global limits never reclaim;
//! - `folio->memcg_data` is kept beside the memmap, by head pfn: a page
//!   migration (compaction) must move it (`mem_cgroup_migrate`);
//! - limit reclaim and the OOM killer reach every mm of the machine (the
//!   mm at hand and the machine's table, `Machine::with_mms`), except
//!   during `fork`: there the parent (taken out of the table for dup_mmap)
//!   and the child being built are no candidates, and the shrinker leaves a
//!   folio the child may map on the queue;
//! - `oom_score_adj` is 0 for every process and v2's memory.oom.group is
//!   not modelled (v1 has neither here).
//!
//! Beside the kernel's counters each group keeps its page-table pages
//! (`kmem`) apart from the rest, which is anonymous folios, and the peak of
//! that anonymous charge (`anon_peak`, raised where a folio is charged):
//! memory.stat's `anon` is a gauge with no peak in the kernel, and
//! `hugelab predict` reports this one.

use crate::mm_types::{MmId, Pfn};
use crate::trace::Step;
use crate::Machine;
use hugelab_workload::{BackendError, Size, Stmt};
use rustc_hash::FxHashMap as HashMap;

/// MAX_RECLAIM_RETRIES (mm/internal.h).
pub const MAX_RECLAIM_RETRIES: u32 = 16;
/// SWAP_CLUSTER_MAX: the least limit reclaim tries to free.
pub const SWAP_CLUSTER_MAX: u64 = 32;

/// A memory cgroup, by its index in [`Memcgs::groups`].
pub type MemcgId = usize;

/// struct page_counter: usage, limit and peak, in pages.
#[derive(Clone, Debug)]
pub struct PageCounter {
    pub usage: u64,
    /// memory.max (PAGE_COUNTER_MAX: unlimited).
    pub max: u64,
    /// The highest usage since the group was created (memory.peak,
    /// v1 max_usage_in_bytes).
    pub watermark: u64,
    /// Charges that found the limit reached (v1 memory.failcnt).
    pub failcnt: u64,
}

/// PAGE_COUNTER_MAX, as far as the model needs it.
pub const PAGE_COUNTER_MAX: u64 = u64::MAX / 2;

impl Default for PageCounter {
    fn default() -> Self {
        PageCounter {
            usage: 0,
            max: PAGE_COUNTER_MAX,
            watermark: 0,
            failcnt: 0,
        }
    }
}

impl PageCounter {
    /// page_counter_try_charge: charges `nr` pages unless the limit would be
    /// exceeded (then counts failcnt).
    pub fn try_charge(&mut self, nr: u64) -> bool {
        if self.usage + nr > self.max {
            self.failcnt += 1;
            return false;
        }
        self.charge(nr);
        true
    }

    /// page_counter_charge: charges whatever the limit.
    pub fn charge(&mut self, nr: u64) {
        self.usage += nr;
        self.watermark = self.watermark.max(self.usage);
    }

    /// page_counter_uncharge.
    pub fn uncharge(&mut self, nr: u64) {
        debug_assert!(self.usage >= nr, "memcg usage would go negative");
        self.usage -= nr;
    }
}

/// memory.events (`enum memcg_memory_event`), the fields the model raises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgEvents {
    /// MEMCG_MAX: a blocking charge found the limit and reclaimed.
    pub max: u64,
    /// MEMCG_OOM: the charge gave up and went to the OOM killer.
    pub oom: u64,
    /// MEMCG_OOM_KILL: a process of the group was OOM-killed.
    pub oom_kill: u64,
}

/// struct mem_cgroup: what the model keeps of it.
#[derive(Clone, Debug)]
pub struct MemCgroup {
    pub name: String,
    pub memory: PageCounter,
    pub events: MemcgEvents,
    /// Pages of `memory.usage` that are page tables (kernel memory); the
    /// rest is anonymous folios, the only other thing the model charges.
    pub kmem: u64,
    /// The most anonymous memory charged at once, in pages: folios count
    /// whole while charged, so a THP partly unmapped (MADV_DONTNEED,
    /// munmap) counts whole until it is split or freed. The kernel has no
    /// such file (memory.stat's `anon` is a gauge); a model-only
    /// observation, raised where an anonymous folio is charged.
    pub anon_peak: u64,
}

impl MemCgroup {
    /// Anonymous pages charged now: memory.stat's `anon`, as the model
    /// charges (whole folios, also the unmapped parts of queued ones).
    pub fn anon(&self) -> u64 {
        self.memory.usage - self.kmem
    }
}

/// The memory cgroups of the machine, who is in which, and what is charged.
#[derive(Default)]
pub struct Memcgs {
    pub groups: Vec<MemCgroup>,
    /// folio->memcg_data: the group each charged folio (by its head pfn)
    /// or page-table page is charged to, and how many pages.
    memcg_data: HashMap<Pfn, (MemcgId, u64)>,
    /// The charged pfns that are page-table pages (memcg_kmem_charge_page).
    kmem_pfns: rustc_hash::FxHashSet<Pfn>,
    /// The memcg of each process (`mm->owner`'s), by mm id.
    mm_memcg: HashMap<MmId, MemcgId>,
    /// The OOM kill of the charge being traced (`hugelab explain`).
    pub traced_kill: Option<Step>,
    /// The mms the OOM killer chose during the statement, in kill order
    /// (mark_oom_victim): the mm at hand of the charge is only marked (its
    /// task dies with SIGKILL when the fault returns); another is torn down
    /// at once (exit_mmap, as the OOM reaper would), and exec retires its
    /// tasks when the statement ends.
    pub killed: Vec<MmId>,
}

impl Memcgs {
    /// Whether any group exists (otherwise nothing is ever charged).
    #[inline]
    pub fn is_active(&self) -> bool {
        !self.groups.is_empty()
    }

    /// mem_cgroup_css_alloc, with memory.max written as `max_pages`.
    pub fn create(&mut self, name: &str, max_pages: Option<u64>) -> MemcgId {
        let mut memory = PageCounter::default();
        if let Some(max) = max_pages {
            memory.max = max.min(PAGE_COUNTER_MAX);
        }
        self.groups.push(MemCgroup {
            name: name.to_string(),
            memory,
            events: MemcgEvents::default(),
            kmem: 0,
            anon_peak: 0,
        });
        self.groups.len() - 1
    }

    pub fn by_name(&self, name: &str) -> Option<MemcgId> {
        self.groups.iter().position(|g| g.name == name)
    }

    /// A process joins a group (spawn into it, or fork inheriting it).
    pub fn attach(&mut self, mm_id: MmId, memcg: MemcgId) {
        self.mm_memcg.insert(mm_id, memcg);
    }

    /// A process left (exit or kill).
    pub fn detach(&mut self, mm_id: MmId) {
        self.mm_memcg.remove(&mm_id);
    }

    /// get_mem_cgroup_from_mm.
    ///
    /// Not named get_mem_cgroup_from_mm: the model keeps no css reference to get.
    #[inline]
    pub fn mm_memcg(&self, mm_id: MmId) -> Option<MemcgId> {
        if self.groups.is_empty() {
            return None;
        }
        self.mm_memcg.get(&mm_id).copied()
    }

    /// Whether charges to `memcg` can fail (it has a limit).
    pub fn limited(&self, memcg: Option<MemcgId>) -> bool {
        memcg.is_some_and(|g| self.groups[g].memory.max < PAGE_COUNTER_MAX)
    }

    /// mem_cgroup_margin: pages that can still be charged.
    pub fn margin(&self, memcg: MemcgId) -> u64 {
        let c = &self.groups[memcg].memory;
        c.max.saturating_sub(c.usage)
    }

    /// The group `pfn` (a folio head or page-table page) is charged to.
    pub fn folio_memcg(&self, pfn: Pfn) -> Option<MemcgId> {
        self.memcg_data.get(&pfn).map(|&(g, _)| g)
    }

    /// Every charged folio and page-table page: (pfn, group, pages), for
    /// the invariant checker.
    pub fn charged(&self) -> impl Iterator<Item = (Pfn, MemcgId, u64)> + '_ {
        self.memcg_data.iter().map(|(&p, &(g, n))| (p, g, n))
    }

    /// An anonymous folio was charged to `memcg`: its peak of anonymous
    /// memory may rise.
    pub(crate) fn anon_charged(&mut self, memcg: MemcgId) {
        let g = &mut self.groups[memcg];
        g.anon_peak = g.anon_peak.max(g.anon());
    }

    /// Whether charged `pfn` is a page-table page (kernel memory).
    pub fn is_kmem(&self, pfn: Pfn) -> bool {
        self.kmem_pfns.contains(&pfn)
    }

    pub(crate) fn commit_charge(&mut self, pfn: Pfn, memcg: MemcgId, nr: u64) {
        let old = self.memcg_data.insert(pfn, (memcg, nr));
        debug_assert!(old.is_none(), "{pfn} charged twice");
    }
}

/// The `cgroup` statement: mkdir of a memory cgroup (`mem_cgroup_css_alloc`)
/// and its memory.max written (`memory_max_write`).
pub fn sys_cgroup(
    m: &mut Machine,
    stmt: &Stmt,
    cgroup: &str,
    memory_max: Option<Size>,
) -> Result<(), BackendError> {
    if m.memcg.by_name(cgroup).is_some() {
        let msg = format!("cgroup '{cgroup}' already exists");
        return Err(crate::syscall::failed(stmt, msg));
    }
    // page_counter_memparse: whole pages, rounded down.
    let max = memory_max.map(|s| s.bytes() / crate::mm_types::PAGE_SIZE);
    m.memcg.create(cgroup, max);
    Ok(())
}

/// A page-table page for the process whose statement runs (`current`,
/// `__memcg_kmem_charge_page` for GFP_PGTABLE_USER): charged whatever the
/// limit (see the module doc).
///
/// The kernel's __memcg_kmem_charge_page, without the underscores of its inline wrapper.
pub fn memcg_kmem_charge_page(m: &mut Machine, pfn: Pfn) {
    if let Some(memcg) = m.current.and_then(|id| m.memcg.mm_memcg(id)) {
        m.memcg.groups[memcg].memory.charge(1);
        m.memcg.groups[memcg].kmem += 1;
        m.memcg.kmem_pfns.insert(pfn);
        m.memcg.commit_charge(pfn, memcg, 1);
    }
}

/// mem_cgroup_uncharge (and `__memcg_kmem_uncharge_page`): `pfn` is being
/// freed; its charge, if any, goes back to its group.
#[inline]
pub fn mem_cgroup_uncharge(m: &mut Machine, pfn: Pfn) {
    if !m.memcg.is_active() {
        return;
    }
    if let Some((memcg, nr)) = m.memcg.memcg_data.remove(&pfn) {
        m.memcg.groups[memcg].memory.uncharge(nr);
        if m.memcg.kmem_pfns.remove(&pfn) {
            m.memcg.groups[memcg].kmem -= nr;
        }
    }
}

/// split_page_memcg: a split folio's charge becomes one per page.
pub fn split_page_memcg(m: &mut Machine, folio: Pfn, nr: u64) {
    if !m.memcg.is_active() {
        return;
    }
    if let Some((memcg, charged)) = m.memcg.memcg_data.remove(&folio) {
        debug_assert_eq!(charged, nr);
        for i in 0..nr {
            m.memcg.commit_charge(Pfn(folio.0 + i), memcg, 1);
        }
    }
}

/// mem_cgroup_migrate: `new` takes over `old`'s charge (a page migration).
pub fn mem_cgroup_migrate(m: &mut Machine, old: Pfn, new: Pfn) {
    if let Some(data) = m.memcg.memcg_data.remove(&old) {
        m.memcg.memcg_data.insert(new, data);
        if m.memcg.kmem_pfns.remove(&old) {
            m.memcg.kmem_pfns.insert(new);
        }
    }
}

/// The pages charged to each group, recounted from the charges, for the
/// invariant checker: usage must equal it.
pub fn recount(m: &Machine) -> Vec<u64> {
    let mut usage = vec![0; m.memcg.groups.len()];
    for (_, g, n) in m.memcg.charged() {
        usage[g] += n;
    }
    usage
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::end_counters;

    const ONLY_PMD: &str = "set transparent_hugepage/hugepages-16kB/enabled never\n\
        set transparent_hugepage/hugepages-32kB/enabled never\n\
        set transparent_hugepage/hugepages-64kB/enabled never\n\
        set transparent_hugepage/hugepages-128kB/enabled never\n\
        set transparent_hugepage/hugepages-256kB/enabled never\n\
        set transparent_hugepage/hugepages-512kB/enabled never\n\
        set transparent_hugepage/hugepages-1024kB/enabled never\n\
        set transparent_hugepage/hugepages-2048kB/enabled inherit\n";

    fn run(body: &str) -> hugelab_workload::Counters {
        end_counters(&format!("{ONLY_PMD}{body}"))
    }

    #[test]
    fn page_counter_refuses_over_max_and_keeps_the_peak() {
        let mut c = PageCounter {
            max: 10,
            ..PageCounter::default()
        };
        assert!(c.try_charge(8));
        assert!(!c.try_charge(3));
        assert_eq!(c.failcnt, 1);
        c.uncharge(8);
        assert!(c.try_charge(10));
        assert_eq!((c.usage, c.watermark), (10, 10));
    }

    #[test]
    fn a_thp_charge_that_cannot_block_falls_back_without_reclaim() {
        let c = run("set transparent_hugepage/enabled always\n\
             set transparent_hugepage/defrag madvise\n\
             cgroup g memory.max=3M\n\
             spawn a cgroup=g\n\
             a mmap buf 4M align=2M\n\
             a write buf:4K\n\
             a write buf+2M:4K\n");
        assert_eq!(c["vmstat.thp_fault_alloc"], 1);
        assert_eq!(c["vmstat.thp_fault_fallback"], 1);
        assert_eq!(c["vmstat.thp_fault_fallback_charge"], 1);
        assert_eq!(c["mthp.2048kB.anon_fault_fallback_charge"], 1);
        // GFP_TRANSHUGE_LIGHT: nomem before MEMCG_MAX.
        assert_eq!(c["memcg.g.memory.events.max"], 0);
    }

    #[test]
    fn a_blocking_thp_charge_reclaims_an_underused_thp_first() {
        let c = run("set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/defrag madvise\n\
             set transparent_hugepage/khugepaged/max_ptes_none 409\n\
             cgroup g memory.max=3M\n\
             spawn a cgroup=g\n\
             a mmap one 2M align=2M\n\
             a madvise one HUGEPAGE\n\
             a write one:4K\n\
             a mmap two 2M align=2M\n\
             a madvise two HUGEPAGE\n\
             a write two:4K\n");
        assert_eq!(c["vmstat.thp_fault_alloc"], 2);
        assert_eq!(c["vmstat.thp_underused_split_page"], 1);
        assert_eq!(c["vmstat.thp_fault_fallback_charge"], 0);
        assert_eq!(c["memcg.g.memory.events.max"], 1);
    }

    #[test]
    fn a_blocking_thp_charge_with_nothing_to_reclaim_falls_back_without_oom() {
        let c = run("set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/defrag madvise\n\
             cgroup g memory.max=3M\n\
             spawn a cgroup=g\n\
             a mmap one 2M align=2M\n\
             a madvise one HUGEPAGE\n\
             a write one\n\
             a mmap two 2M align=2M\n\
             a madvise two HUGEPAGE\n\
             a write two:4K\n");
        assert_eq!(c["vmstat.thp_fault_fallback_charge"], 1);
        // Costly order: the retry loop ends without mem_cgroup_oom.
        assert_eq!(c["memcg.g.memory.events.oom"], 0);
        assert_eq!(c["vmstat.oom_kill"], 0);
        // One reclaim, one after the drain, MAX_RECLAIM_RETRIES more.
        assert_eq!(
            c["memcg.g.memory.events.max"],
            2 + i64::from(MAX_RECLAIM_RETRIES)
        );
    }

    #[test]
    fn an_order0_charge_with_nothing_to_reclaim_kills_the_largest_process() {
        let c = run("set transparent_hugepage/enabled never\n\
             cgroup g memory.max=2M\n\
             spawn a cgroup=g\n\
             a mmap buf 512K\n\
             a write buf\n\
             a fork b\n\
             b mmap big 4M\n\
             b write big\n\
             expect signal == SIGKILL\n\
             a mmap more 256K\n\
             a write more\n");
        assert_eq!(c["vmstat.oom_kill"], 1);
        assert_eq!(c["memcg.g.memory.events.oom"], 1);
        assert_eq!(c["memcg.g.memory.events.oom_kill"], 1);
        assert_eq!(c["smaps.a.Rss"], 768);
        assert!(!c.contains_key("smaps.b.Rss"));
        assert_eq!(c["memcg.g.memory.peak"], 2048);
    }

    #[test]
    fn the_oom_killer_may_choose_another_process_of_the_group() {
        let w = hugelab_workload::parse(
            "t.hlw",
            &format!(
                "{ONLY_PMD}set transparent_hugepage/enabled never\n\
                 cgroup g memory.max=2M\n\
                 spawn big cgroup=g\n\
                 spawn small cgroup=g\n\
                 big mmap buf 1536K\n\
                 big write buf\n\
                 small mmap buf 1M\n\
                 small write buf\n"
            ),
        )
        .unwrap();
        let obs = hugelab_workload::run(&mut crate::Model::default(), &w).unwrap();
        assert_eq!(obs.kills.len(), 1);
        assert_eq!(obs.kills[0].process, "big");
        let c = &obs.snapshots.last().unwrap().counters;
        assert_eq!(c["smaps.small.Rss"], 1024);
    }

    #[test]
    fn every_freed_page_is_uncharged() {
        let c = run("set transparent_hugepage/enabled always\n\
             cgroup g\n\
             spawn a cgroup=g\n\
             a mmap buf 4M align=2M\n\
             a write buf\n\
             a madvise buf+1M:1M DONTNEED\n\
             a fork b\n\
             b write buf:8K\n\
             reclaim\n\
             b exit\n\
             a exit\n");
        assert_eq!(c["memcg.g.memory.current"], 0);
        assert!(c["memcg.g.memory.peak"] >= 4096);
    }

    /// A THP half given back by MADV_DONTNEED leaves RssAnon at once but
    /// stays charged whole on the deferred split queue: 2 MiB written as a
    /// THP, 1 MiB of it dropped, then 1 MiB written in a region too small for
    /// a THP: the processes map at most 2 MiB at once, the cgroup holds 3 MiB.
    #[test]
    fn the_two_anon_peaks_differ_by_a_partly_unmapped_thp() {
        let text = format!(
            "{ONLY_PMD}set transparent_hugepage/enabled always\n\
             cgroup g\n\
             spawn a cgroup=g\n\
             a mmap thp 2M align=2M\n\
             a write thp\n\
             a madvise thp+1M:1M DONTNEED\n\
             a mmap small 1M\n\
             a write small\n"
        );
        let w = hugelab_workload::parse("t.hlw", &text).unwrap();
        let mut model = crate::Model::default();
        hugelab_workload::run(&mut model, &w).unwrap();
        let m = &model.machine;
        let peak = &m.stat.anon_peak;
        assert_eq!(peak.rss_anon, 512);
        // At that moment: the THP alone, PMD-mapped.
        assert_eq!((peak.anon_mapped, peak.anon_thps), (512, 512));
        assert_eq!(peak.nr_anon[9], 1);
        assert_eq!(m.stat.rss_anon, 512);
        let g = &m.memcg.groups[m.memcg.by_name("g").unwrap()];
        assert_eq!(g.anon_peak, 768);
        assert_eq!(g.anon(), 768);
    }
}

#[cfg(test)]
mod trace_tests {
    use crate::trace::Step;
    use hugelab_workload::Backend;

    #[test]
    fn a_charge_fallback_is_traced_with_its_counters() {
        let text = "set transparent_hugepage/enabled always\n\
             set transparent_hugepage/defrag madvise\n\
             set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
             cgroup g memory.max=3M\n\
             spawn a cgroup=g\n\
             a mmap buf 4M align=2M\n\
             a write buf:4K\n\
             a write buf+2M:4K\n";
        let w = hugelab_workload::parse("t.hlw", text).unwrap();
        let mut model = crate::Model::default();
        let (last, before) = w.stmts.split_last().unwrap();
        for stmt in before {
            model.execute(stmt).unwrap();
        }
        model.machine.start_trace();
        // handle_mm_fault does not open fault records yet (hugelab
        // explain will): one record for the statement's steps.
        model.machine.trace_fault(0, true);
        model.execute(last).unwrap();
        let trace = model.machine.take_trace().unwrap();
        let steps: Vec<&Step> = trace.faults.iter().flat_map(|f| &f.steps).collect();
        assert!(steps.iter().any(|s| matches!(s,
            Step::Charge { order: 9, ok: false, memcg, .. } if memcg == "g")));
        assert!(steps.iter().any(|s| matches!(s,
            Step::Fallback { order: 9, counters } if counters.contains(&crate::vmstat::Counted::Vm(crate::vmstat::VmEvent::ThpFaultFallbackCharge)))));
        assert!(steps.iter().any(|s| matches!(
            s,
            Step::Charge {
                order: 0,
                ok: true,
                ..
            }
        )));
    }
}
