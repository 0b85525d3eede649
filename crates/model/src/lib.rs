//! An executable model of Linux 6.18 anonymous memory management with
//! multi-size THP, deterministic and much faster than real time.
//!
//! The modules are a map of the kernel's `mm/`: `memory` (faults,
//! copy-on-write) and `memory_zap` (zap: munmap, exit, MADV_DONTNEED),
//! `fork` (dup_mmap, copy_page_range), `gup` (long-term pins), `huge_memory`
//! (the huge zero folio, split_huge_pmd, split_folio, the deferred split
//! shrinker) with `huge_memory_fault` (the PMD fault paths) and
//! `deferred_split` (the queue), `hugetlb` (HugeTLB pools, reservations,
//! faults), `hugetlb_vmemmap` (HVO), `khugepaged`, `rmap`, `mmap`,
//! `mprotect`, `filemap` (the page cache of `file=` mappings and shared
//! anonymous memory, fault-around), `madvise` (also MADV_FREE, COLD, PAGEOUT), `memcontrol`
//! (memory cgroups: page counters, uncharge, migration) with
//! `memcontrol_charge` (the charge, its limit reclaim and OOM) and
//! `oom_kill` (the memcg OOM killer), `swap` (the LRU flags of anon folios),
//! `vmscan` (drop_slab, reclaim_pages, memcg limit reclaim), `mmzone` (the
//! zone's buddy free lists with migratetypes), `page_alloc` (folio
//! allocation and free, the allocation slow path), `compaction` (direct compaction, kcompactd,
//! migration), `pagewalk` (the page mapped at an address), `fragment` (the
//! unmovable-page generator of the `fragment` statement), `mms` (the
//! address spaces by id and the tasks using them: mm_alloc, threads,
//! mmput), `fs_exec` (exec's new mm, from fs/exec.c), `internal` (folio_pte_batch, from mm/internal.h), `pgtable`,
//! `sparse` (memmap), `vmstat`, `task_mmu` (smaps), `reading_cache`
//! (readings kept until a statement changes them), `thp_utilization` (folio
//! causes and written subpages for the utilization report), `debug_vm`
//! (invariant checks), `syscall` (what the statement handlers share) and
//! `exec` (the statements' dispatch).
//!
//! Headers, as include/linux/ has them: `mm_types` (struct page,
//! mm_struct, vm_area_struct), `huge_mm` (the THP settings and order
//! helpers), `gfp` (allocation flags) and `trace` (the recorded decisions).
//! There is no cycle between files: where two mechanisms call each other
//! in the kernel (a fault charges, the charge reclaims, reclaim splits), the
//! caller's half is a file of its own above the callee's.
//! Each module's doc comment names the kernel code it follows and what it
//! leaves out.
//!
//! Machine-wide simplifications: x86_64 with 4 KiB pages and one NUMA node; no
//! swap or concurrency yet; a page cache only for the workload's files and
//! shared anonymous mappings (`filemap`: order 0, never reclaimed); statements the model
//! cannot execute are refused with an error naming them, never ignored.
//!
//! One machine owns every address space: `Machine::mms` holds each
//! `mm_struct` by its `MmId` and `Machine::tasks` the tasks, each naming the
//! mm it runs in (threads share one). An operation on an mm takes it out of
//! the table and works on it beside `&mut Machine`; a walk that reaches
//! other mms (rmap, compaction, memcg reclaim and OOM, HugeTLB) borrows the
//! whole table through `Machine::with_mms` (see `mms`).
//!
//! The model is pure: no files, clocks, syscalls or unseeded randomness. The
//! same workload gives the same counters, bit for bit.

/// The kernel version the model follows: a recording made on another
/// kernel is refused by the tools that replay it as a prediction.
pub const LINUX_VERSION: &str = "6.18";

pub mod compaction;
pub mod counters;
pub mod debug_vm;
pub mod deferred_split;
mod exec;
pub mod filemap;
pub mod fork;
pub mod fragment;
pub mod fs_exec;
pub mod gfp;
pub mod gup;
pub mod huge_memory;
pub mod huge_memory_fault;
pub mod huge_mm;
pub mod hugetlb;
pub mod hugetlb_vmemmap;
pub mod internal;
pub mod khugepaged;
pub mod khugepaged_thread;
pub mod madvise;
pub mod memcontrol;
pub mod memcontrol_charge;
pub mod memory;
pub mod memory_zap;
pub mod mm_types;
pub mod mmap;
pub mod mms;
pub mod mmzone;
pub mod mprotect;
pub mod mremap;
pub mod oom_kill;
pub mod page_alloc;
pub mod pagewalk;
pub mod pgtable;
pub mod reading_cache;
pub mod rmap;
pub mod sparse;
pub mod special_mapping;
pub mod swap;
pub mod syscall;
pub mod task_mmu;
pub mod thp_utilization;
pub mod trace;
pub mod vmscan;
pub mod vmstat;

use crate::deferred_split::DeferredSplitQueue;
use crate::huge_mm::ThpSettings;
use crate::mm_types::{pg, Fault, Pfn, PAGE_SIZE};
use crate::mmzone::Zone;
use crate::vmstat::VmStat;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The default simulated memory size (`machine memory=`).
pub const DEFAULT_MEMORY_BYTES: u64 = 16 << 30;

/// Machine-wide kernel state: physical memory, counters, THP settings, the
/// huge zero folio and the deferred split queue.
pub struct Machine {
    pub zone: Zone,
    pub stat: VmStat,
    pub thp: ThpSettings,
    pub huge_zero_folio: Option<Pfn>,
    /// huge_zero_refcount: one for the shrinker plus one per mm mapping it.
    pub huge_zero_refcount: u64,
    pub deferred_split_queue: DeferredSplitQueue,
    /// The MM-ID slots of large folios mapped by more than one MM (see rmap).
    pub folio_mm_ids: HashMap<Pfn, rmap::FolioMmIds>,
    /// The anon_vmas large folios point at (see rmap).
    pub anon_vmas: rmap::AnonVmas,
    /// HugeTLB pools, pages, files and reservations.
    pub hugetlb: hugetlb::Hugetlb,
    /// The vmemmap of HugeTLB pages (HVO) and the memmap counters.
    pub vmemmap: hugetlb_vmemmap::Vmemmap,
    /// The LRU state of anon folios that left the default (see swap).
    pub lru: swap::Lru,
    /// Fault decisions being recorded for `hugelab explain` (see trace).
    pub trace: Option<Box<trace::Trace>>,
    /// Every address space, by id (see `mms`).
    pub mms: mms::Mms,
    /// The tasks by name (init_task's list); a task that exited is gone.
    pub tasks: BTreeMap<String, Task>,
    /// `current->mm`: the mm of the task whose statement runs (kernel
    /// memory, page tables, is charged to its memcg).
    pub current: Option<mm_types::MmId>,
    /// pgdat->kcompactd_max_order: the order kcompactd was woken for, run
    /// when the statement ends (0: not woken).
    pub kcompactd_max_order: u32,
    /// khugepaged's scan cursor and the model's clock (see khugepaged_thread).
    pub khugepaged: khugepaged_thread::KhugepagedScan,
    /// Pages the fragmentation generator holds (unmovable kernel pages).
    pub unmovable_pages: u64,
    /// Memory cgroups and what is charged to them (see memcontrol).
    pub memcg: memcontrol::Memcgs,
    /// x86 memory protection keys in use (`machine pkeys=`; see
    /// `Vma::allows`).
    pub pkeys: bool,
    /// The page cache of the workload's files (see filemap).
    pub page_cache: filemap::PageCache,
    /// A bug put in on purpose, to show the invariant checker catches it.
    #[doc(hidden)]
    pub injected_bug: Option<InjectedBug>,
}

/// Deliberate bugs for tests of the invariant checker; never set otherwise.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedBug {
    /// folio_try_dup_anon_rmap_ptes forgets the first page's `_mapcount`
    /// increment when fork shares a PTE-mapped large folio.
    DupRmapPtesSkipsMapcount,
    /// dup_mmap gives the child an anon_vma of its own, not linked under
    /// the parent's: rmap walks of shared folios miss the child.
    ForkSkipsAnonVmaLink,
}

impl Machine {
    pub fn new(memory_bytes: u64) -> Self {
        Machine {
            zone: Zone::new(memory_bytes / PAGE_SIZE),
            stat: VmStat::default(),
            thp: ThpSettings::default(),
            huge_zero_folio: None,
            huge_zero_refcount: 0,
            deferred_split_queue: DeferredSplitQueue::default(),
            folio_mm_ids: HashMap::default(),
            anon_vmas: rmap::AnonVmas::default(),
            hugetlb: hugetlb::Hugetlb::default(),
            vmemmap: hugetlb_vmemmap::Vmemmap::default(),
            lru: swap::Lru::default(),
            trace: None,
            mms: mms::Mms::default(),
            tasks: BTreeMap::new(),
            current: None,
            kcompactd_max_order: 0,
            khugepaged: khugepaged_thread::KhugepagedScan::default(),
            unmovable_pages: 0,
            memcg: memcontrol::Memcgs::default(),
            page_cache: filemap::PageCache::default(),
            pkeys: false,
            injected_bug: None,
        }
    }

    /// pte_alloc_one: a page-table page (NR_PAGETABLE).
    pub fn pte_alloc_one(&mut self) -> Result<Pfn, Fault> {
        let pfn = self
            .zone
            .alloc_pages_mt(0, mmzone::MigrateType::Unmovable)
            .ok_or(Fault::Oom)?;
        self.zone.memmap.page_mut(pfn).init(pg::PGTABLE, 0);
        self.stat.nr_pagetable += 1;
        memcontrol::memcg_kmem_charge_page(self, pfn);
        Ok(pfn)
    }

    /// pte_free.
    pub fn pte_free(&mut self, pfn: Pfn) {
        debug_assert!(self.zone.memmap.page(pfn).test(pg::PGTABLE));
        self.stat.nr_pagetable -= 1;
        memcontrol::mem_cgroup_uncharge(self, pfn);
        self.zone.free_pages(pfn, 0);
    }
}

pub use mms::Task;

/// The model backend: a `Machine`, with the processes running on it.
pub struct Model {
    pub machine: Machine,
    memory_bytes: u64,
    /// Whether any process has run (after which `machine` may not change).
    started: bool,
    /// Long-term pins in force (io_uring fixed buffers), oldest first.
    pub pins: Vec<gup::Pin>,
    /// Run `debug_vm::check` after every statement (`--check`).
    check_invariants: bool,
    /// Each process's counters until a statement may change them.
    pub(crate) reading_cache: reading_cache::ReadingCache,
}

impl Default for Model {
    fn default() -> Self {
        Model::new(DEFAULT_MEMORY_BYTES)
    }
}

impl Model {
    pub fn new(memory_bytes: u64) -> Self {
        Model {
            machine: Machine::new(memory_bytes),
            memory_bytes,
            started: false,
            pins: Vec::new(),
            check_invariants: false,
            reading_cache: reading_cache::ReadingCache::default(),
        }
    }

    /// Checks every invariant of `debug_vm` after each statement; a broken
    /// one fails the statement (a model bug, not the workload's).
    pub fn with_invariant_checks(mut self) -> Self {
        self.check_invariants = true;
        self
    }

    /// Starts from these THP settings instead of the defaults (`diff` starts the
    /// model from the real machine's values).
    pub fn with_thp_settings(mut self, thp: ThpSettings) -> Self {
        self.machine.thp = thp;
        self
    }

    /// Whether the CPU's memory protection keys are in use (`diff` starts
    /// the model from the machine's: an exec-only mapping is unreadable
    /// with them).
    pub fn with_pkeys(mut self, pkeys: bool) -> Self {
        self.machine.pkeys = pkeys;
        self
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Host memory the model uses for its state, approximately (for benchmarks).
    pub fn footprint_bytes(&self) -> u64 {
        let tables: u64 = self
            .machine
            .mms
            .iter()
            .map(|mm| mm.pmds.footprint_bytes())
            .sum();
        self.machine.zone.footprint_bytes() + tables
    }
}

/// Runs a workload text on a fresh model: the counters at its end. For the
/// modules' unit tests.
#[cfg(test)]
pub(crate) fn end_counters(text: &str) -> hugelab_workload::Counters {
    let w = hugelab_workload::parse("test.hlw", text).expect("test workload parses");
    let obs = hugelab_workload::run(&mut Model::default(), &w).expect("test workload runs");
    obs.snapshots
        .last()
        .expect("the end snapshot")
        .counters
        .clone()
}

/// The start of the under-used THP tests: one PMD THP's worth of `buf` in
/// process `a`, THP on by MADV_HUGEPAGE, `max_ptes_none` 409 (the shrinker
/// authors' value), then `body`. For the modules' unit tests.
#[cfg(test)]
pub(crate) fn one_thp_at_409(body: &str) -> String {
    format!(
        "set transparent_hugepage/enabled madvise\n\
         set transparent_hugepage/khugepaged/max_ptes_none 409\n\
         spawn a\n\
         a mmap buf 2M align=2M\n\
         a madvise buf HUGEPAGE\n\
         {body}"
    )
}
