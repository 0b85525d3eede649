//! An executable model of Linux 6.18 anonymous memory management with
//! multi-size THP, deterministic and much faster than real time.
//!
//! The modules are a map of the kernel's `mm/`: `memory` (faults, zap,
//! copy-on-write), `fork` (dup_mmap, copy_page_range), `gup` (long-term pins),
//! `huge_memory` (THP orders, PMD faults, split_huge_pmd, split_folio, the
//! deferred split queue and its shrinker), `hugetlb` (HugeTLB pools,
//! reservations, faults), `hugetlb_vmemmap` (HVO), `khugepaged`, `rmap`, `mmap`,
//! `mprotect`, `madvise` (also MADV_FREE, COLD, PAGEOUT), `memcontrol`
//! (memory cgroups: charges, limit reclaim, the memcg OOM killer), `swap` (the LRU
//! flags of anon folios), `vmscan` (drop_slab, reclaim_pages), `page_alloc`
//! (buddy allocator with migratetypes, folio allocation and free, the
//! allocation slow path), `compaction` (direct compaction, kcompactd,
//! migration), `fragment` (the unmovable-page generator of the `fragment`
//! statement), `internal` (folio_pte_batch, from
//! mm/internal.h), `mm_types` (struct page, page_folio), `pgtable`, `sparse`
//! (memmap), `vmstat`, `task_mmu` (smaps), `reading_cache` (readings kept
//! until a statement changes them), `thp_utilization` (folio
//! causes and written subpages for the utilization report), `debug_vm`
//! (invariant checks).
//! Each module's doc comment names the kernel code it follows and what it
//! leaves out.
//!
//! Machine-wide simplifications: x86_64 with 4 KiB pages and one NUMA node; no
//! swap, page cache or concurrency yet; statements the model
//! cannot execute are refused with an error naming them, never ignored.
//!
//! The model is pure: no files, clocks, syscalls or unseeded randomness. The
//! same workload gives the same counters, bit for bit.

pub mod compaction;
pub mod counters;
pub mod debug_vm;
mod exec;
pub mod fork;
pub mod fragment;
pub mod gfp;
pub mod gup;
pub mod huge_memory;
pub mod hugetlb;
pub mod hugetlb_vmemmap;
pub mod internal;
pub mod khugepaged;
pub mod madvise;
pub mod memcontrol;
pub mod memory;
pub mod mm_types;
pub mod mmap;
pub mod mprotect;
pub mod page_alloc;
pub mod pgtable;
pub mod reading_cache;
pub mod rmap;
pub mod sparse;
pub mod swap;
pub mod task_mmu;
pub mod thp_utilization;
pub mod trace;
pub mod vmscan;
pub mod vmstat;

use crate::huge_memory::{DeferredSplitQueue, ThpSettings};
use crate::mm_types::{pg, Fault, Pfn, PAGE_SIZE};
use crate::mmap::MmStruct;
use crate::page_alloc::Zone;
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
    /// The other processes' address spaces, lent by `exec` for a statement
    /// whose allocations may need compaction, so that migration can rewrite
    /// their page tables (the model's stand-in for an rmap walk of order-0
    /// folios; see `compaction`). Empty otherwise.
    pub lent_mms: Vec<MmStruct>,
    /// pgdat->kcompactd_max_order: the order kcompactd was woken for, run
    /// when the statement ends (0: not woken).
    pub kcompactd_max_order: u32,
    /// Pages the fragmentation generator holds (unmovable kernel pages).
    pub unmovable_pages: u64,
    /// Memory cgroups and what is charged to them (see memcontrol).
    pub memcg: memcontrol::Memcgs,
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
            lent_mms: Vec::new(),
            kcompactd_max_order: 0,
            unmovable_pages: 0,
            memcg: memcontrol::Memcgs::default(),
            injected_bug: None,
        }
    }

    /// pte_alloc_one: a page-table page (NR_PAGETABLE).
    pub fn pte_alloc_one(&mut self) -> Result<Pfn, Fault> {
        let pfn = self
            .zone
            .alloc_pages_mt(0, page_alloc::MigrateType::Unmovable)
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

/// A process of the workload: its address space.
pub struct Task {
    pub mm: MmStruct,
    /// Faults this task's accesses took (`task_struct.min_flt`, shown as
    /// minflt in /proc/PID/stat).
    pub min_flt: u64,
}

/// The model backend: a `Machine` and the processes running on it.
pub struct Model {
    pub machine: Machine,
    memory_bytes: u64,
    /// Processes by name; a process that exited is gone.
    pub tasks: BTreeMap<String, Task>,
    /// Whether any process has run (after which `machine` may not change).
    started: bool,
    /// The last mm_id handed out (0 is MM_ID_DUMMY).
    last_mm_id: rmap::MmId,
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
            tasks: BTreeMap::new(),
            started: false,
            last_mm_id: rmap::MM_ID_DUMMY,
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

    /// A fresh mm_id for a new address space.
    ///
    /// The kernel's `mm_alloc_id` (kernel/fork.c); the name is left for the
    /// restructuring of the machine's address spaces to take.
    pub fn alloc_mm_id(&mut self) -> rmap::MmId {
        self.last_mm_id += 1;
        self.last_mm_id
    }

    pub fn memory_bytes(&self) -> u64 {
        self.memory_bytes
    }

    /// Host memory the model uses for its state, approximately (for benchmarks).
    pub fn footprint_bytes(&self) -> u64 {
        let tables: u64 = self
            .tasks
            .values()
            .map(|t| t.mm.pmds.footprint_bytes())
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
