//! The counter registry: every counter hugelab knows, in one place.
//!
//! A counter name is `<family>.<parts>`, with the family named after the
//! kernel file it is read from and the last part the kernel's own spelling of
//! the field, byte for byte (`vmstat.thp_fault_alloc`,
//! `mthp.64kB.anon_fault_alloc`, `smaps.a.buf.AnonHugePages`). For each family
//! the registry says which names exist, whether each counts events or is a
//! gauge, its unit, how a backend reports it (the change since the workload
//! started, or the absolute value) and where the kernel keeps it; for the
//! counters that count attempts rather than outcomes, the bound `hugelab diff`
//! compares them with and why.
//!
//! Everything that names a counter goes through here: the parser refuses an
//! `expect` on a name no family describes (with the nearest known name), the
//! kernel backend reads the fields listed here, the model reports only the
//! counters it models (a subset), `diff` takes its bounds from here and
//! `compare` its rows.

use crate::smaps::SmapsField;
use crate::text::valid_name;
use serde::Serialize;

/// Whether a counter counts events or measures a quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CounterKind {
    /// Counts events (`thp_fault_alloc`, `pgfault`): always reported as the
    /// number of events since the workload started.
    Event,
    /// A quantity (`nr_anon_pages`, `Rss`, `nr_hugepages`).
    Gauge,
}

/// How a backend reports a counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reported {
    /// The change since the workload started: every event counter, and the
    /// system-wide gauges of memory the workload itself maps
    /// (`nr_anon_pages`, `AnonPages`), since the rest of the machine is not
    /// the workload's. The model's machine starts empty, so there it is the
    /// absolute value.
    SinceStart,
    /// The value as read: per-process and per-cgroup gauges, and pools the
    /// workload sets itself (hugetlb).
    Absolute,
}

/// The unit of a counter's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Base pages (4 KiB on x86_64).
    Pages,
    /// Kibibytes, as /proc prints them.
    Kb,
    /// Events.
    Count,
    /// Folios (any size).
    Folios,
    /// Huge pages of the family's size (hugetlb pools, HugePages_*).
    HugePages,
}

/// Which way the kernel may differ from the model on a counter that counts
/// attempts or depends on state the workload does not control.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundKind {
    /// The kernel may count more than the model.
    KernelAtLeastModel,
    /// The kernel may count less than the model.
    KernelAtMostModel,
    /// Compared by its sum with the family's other field of this name (in
    /// the same counter name, the last part replaced): which of the two
    /// the kernel moves depends on the machine's state, their sum does not.
    /// Equal values match; equal sums are within the bound.
    SumWith(&'static str),
    /// The kernel reads at least the model and at most this much more.
    KernelAboveModelBy(i64),
}

impl BoundKind {
    /// For people: `kernel_at_least_model`, `sum with nr_memmap_boot_pages`.
    pub fn describe(self) -> String {
        match self {
            BoundKind::KernelAtLeastModel => "kernel_at_least_model".into(),
            BoundKind::KernelAtMostModel => "kernel_at_most_model".into(),
            BoundKind::SumWith(field) => format!("sum with {field}"),
            BoundKind::KernelAboveModelBy(n) => format!("kernel_above_model_by_at_most {n}"),
        }
    }
}

/// The bound `hugelab diff` compares a counter with, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bound {
    pub kind: BoundKind,
    pub why: &'static str,
}

/// One field of a family: the last part of a counter name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Field {
    pub name: &'static str,
    pub kind: CounterKind,
    pub unit: Unit,
    pub reported: Reported,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound: Option<Bound>,
    /// What the counter means, in a few words (after the kernel's
    /// documentation: admin-guide/mm/transhuge.rst, filesystems/proc.rst,
    /// admin-guide/cgroup-v2.rst, admin-guide/mm/hugetlbpage.rst).
    pub what: &'static str,
}

impl Field {
    /// The field with its meaning.
    const fn means(self, what: &'static str) -> Field {
        Field { what, ..self }
    }
}

/// A part of a counter name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    /// The family name or another fixed word.
    Lit(&'static str),
    /// A process of the workload (`spawn`ed or `fork`ed).
    Proc,
    /// A region of that process.
    Region,
    /// A cgroup of the workload.
    Cgroup,
    /// A size as the kernel names its directories: `<n>kB`, n a power of two.
    Size,
    /// One of the family's fields.
    Field,
    /// One of a few fixed words.
    Choice(&'static [&'static str]),
}

/// Which part of the machine a family describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// The whole machine: other processes move these counters too.
    System,
    /// One process of the workload.
    Process,
    /// One memory cgroup of the workload.
    Cgroup,
}

/// A family of counters.
#[derive(Debug, Serialize)]
pub struct Family {
    /// The first part of every name of the family.
    pub name: &'static str,
    /// The names' shape, for people (`mthp.<size>.<stat>`).
    pub pattern: &'static str,
    pub scope: Scope,
    /// Where the kernel keeps the counters.
    pub source: &'static str,
    #[serde(skip)]
    shapes: &'static [&'static [Part]],
    pub fields: &'static [Field],
}

const fn event(name: &'static str) -> Field {
    Field {
        name,
        kind: CounterKind::Event,
        unit: Unit::Count,
        reported: Reported::SinceStart,
        bound: None,
        what: "",
    }
}

const fn bounded(name: &'static str, kind: BoundKind, why: &'static str) -> Field {
    Field {
        bound: Some(Bound { kind, why }),
        ..event(name)
    }
}

/// A gauge of the whole machine: reported as its change since the start.
const fn system_gauge(name: &'static str, unit: Unit) -> Field {
    Field {
        name,
        kind: CounterKind::Gauge,
        unit,
        reported: Reported::SinceStart,
        bound: None,
        what: "",
    }
}

const fn absolute(name: &'static str, unit: Unit) -> Field {
    Field {
        name,
        kind: CounterKind::Gauge,
        unit,
        reported: Reported::Absolute,
        bound: None,
        what: "",
    }
}

const SPLIT_ATTEMPTS: &str = "counts split attempts, and drop_caches retries the deferred-split shrinker a varying number of times";
const KHUGEPAGED_PASSES: &str = "khugepaged counts a range that fails its checks once per pass, and the kernel backend lets it make at least two full passes where the model makes one";
const HUGE_ZERO_FOLIO: &str = "the huge zero folio may already exist on the machine (it lives until a shrinker frees it), so the kernel allocates it at most as often as the model";
const BACKGROUND_COMPACTION: &str = "kcompactd (woken by any process's failing allocation, or proactive compaction) and direct compaction of other processes compact the real machine on their own, and the kernel backend cannot tell their work from the workload's; the model compacts only for the workload";
const MEMMAP_SUM: &str = "HVO frees a HugeTLB page's vmemmap from boot memory (PageReserved: nr_memmap_boot_pages) or from pages an earlier restore allocated (nr_memmap_pages), whichever frames the kernel's page happens to have; only their sum is the workload's (measured here: a first 16-page cycle +16/-128, a later one -104/-8, the sum -7 per 2 MiB page every time)";

use BoundKind::{KernelAboveModelBy, KernelAtLeastModel, KernelAtMostModel, SumWith};

/// /proc/vmstat: `include/linux/vm_event_item.h` (events) and the node and
/// zone stats of `mm/vmstat.c` that concern anonymous memory, page tables,
/// memmap and free memory.
const VMSTAT: &[Field] = &[
    event("pgfault").means("page faults of every kind, minor and major"),
    event("pgdeactivate").means("pages moved from the active to the inactive LRU list"),
    event("pglazyfree").means("pages MADV_FREE marked lazily freeable"),
    event("pglazyfreed").means("lazily freeable pages reclaim freed without writing them out"),
    event("oom_kill").means("processes the OOM killer killed"),
    event("thp_migration_success").means("THPs migrated whole, without a split"),
    event("thp_migration_fail")
        .means("THPs that failed to migrate whole (split afterwards or not)"),
    event("thp_migration_split").means("THPs split so that their pages could be migrated"),
    event("thp_fault_alloc").means("PMD THPs allocated and charged for a page fault"),
    event("thp_fault_fallback")
        .means("faults that failed to allocate or charge a PMD THP, or get the huge zero folio"),
    event("thp_fault_fallback_charge")
        .means("page faults that allocated a PMD THP but failed to charge it"),
    event("thp_collapse_alloc")
        .means("THPs khugepaged or MADV_COLLAPSE allocated to collapse a range into"),
    event("thp_collapse_alloc_failed")
        .means("collapses of a range that qualified but found no THP to allocate"),
    event("thp_file_alloc").means("shmem PMD THPs allocated (shmem only, despite the name)"),
    event("thp_file_fallback")
        .means("shmem PMD THP allocations or charges that failed (shmem only)"),
    event("thp_file_fallback_charge")
        .means("shmem PMD THPs allocated but not charged (shmem only)"),
    event("thp_file_mapped").means("shmem or file THPs mapped by a PMD at a fault"),
    event("thp_split_page").means("PMD-sized THPs split into smaller folios"),
    bounded("thp_split_page_failed", KernelAtLeastModel, SPLIT_ATTEMPTS)
        .means("THP splits that failed, e.g. because the page was pinned"),
    event("thp_deferred_split_page")
        .means("PMD THPs that became partially mapped (queued for the deferred split shrinker)"),
    event("thp_underused_split_page")
        .means("fully mapped THPs split as under-used: more zero-filled pages than max_ptes_none"),
    event("thp_split_pmd")
        .means("PMD mappings split into PTEs (the THP stays whole), e.g. by a partial munmap"),
    bounded(
        "thp_scan_exceed_none_pte",
        KernelAtLeastModel,
        KHUGEPAGED_PASSES,
    )
    .means("ranges khugepaged skipped for more none or zero-page PTEs than max_ptes_none"),
    event("thp_scan_exceed_swap_pte")
        .means("ranges khugepaged skipped for more swap PTEs than max_ptes_swap"),
    bounded(
        "thp_scan_exceed_share_pte",
        KernelAtLeastModel,
        KHUGEPAGED_PASSES,
    )
    .means("ranges khugepaged skipped for more PTEs of shared pages than max_ptes_shared"),
    event("thp_split_pud").means("PUD mappings split"),
    bounded("thp_zero_page_alloc", KernelAtMostModel, HUGE_ZERO_FOLIO)
        .means("allocations of the huge zero folio (not its mappings)"),
    event("thp_zero_page_alloc_failed")
        .means("failures to allocate the huge zero folio; small zero pages used instead"),
    event("thp_swpout").means("PMD THPs swapped out whole to a swap device, without a split"),
    event("thp_swpout_fallback")
        .means("THPs split before swap-out, usually for want of contiguous swap space"),
    // mm/compaction.c and mm/migrate.c (CONFIG_COMPACTION): the model
    // compacts only when memory is fragmented (model-only scenarios).
    bounded(
        "compact_migrate_scanned",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages compaction's migration scanner looked at"),
    bounded(
        "compact_free_scanned",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages compaction's free scanner looked at"),
    bounded(
        "compact_isolated",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages compaction isolated, to migrate or as targets"),
    bounded("compact_stall", KernelAtLeastModel, BACKGROUND_COMPACTION)
        .means("direct compactions: allocations that stopped to compact"),
    bounded("compact_fail", KernelAtLeastModel, BACKGROUND_COMPACTION)
        .means("direct compactions that made no free block of the order"),
    bounded("compact_success", KernelAtLeastModel, BACKGROUND_COMPACTION)
        .means("direct compactions that made a free block of the order"),
    bounded(
        "compact_daemon_wake",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("times kcompactd woke up"),
    bounded(
        "compact_daemon_migrate_scanned",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages kcompactd's migration scanner looked at"),
    bounded(
        "compact_daemon_free_scanned",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages kcompactd's free scanner looked at"),
    bounded(
        "pgmigrate_success",
        KernelAtLeastModel,
        BACKGROUND_COMPACTION,
    )
    .means("pages migrated"),
    bounded("pgmigrate_fail", KernelAtLeastModel, BACKGROUND_COMPACTION)
        .means("pages that failed to migrate"),
    system_gauge("nr_free_pages", Unit::Pages).means("free pages in the buddy allocator"),
    system_gauge("nr_anon_pages", Unit::Pages)
        .means("pages of anonymous memory mapped into page tables"),
    // NR_ANON_THPS / HPAGE_PMD_NR: PMD-sized THPs, not pages.
    system_gauge("nr_anon_transparent_hugepages", Unit::Folios).means("anonymous PMD-sized THPs"),
    system_gauge("nr_page_table_pages", Unit::Pages).means("pages holding page tables"),
    Field {
        bound: Some(Bound {
            kind: SumWith("nr_memmap_boot_pages"),
            why: MEMMAP_SUM,
        }),
        ..system_gauge("nr_memmap_pages", Unit::Pages)
            .means("pages of struct page (memmap) allocated at run time")
    },
    Field {
        bound: Some(Bound {
            kind: SumWith("nr_memmap_pages"),
            why: MEMMAP_SUM,
        }),
        ..system_gauge("nr_memmap_boot_pages", Unit::Pages)
            .means("pages of struct page (memmap) allocated at boot")
    },
];

/// hugepages-<size>/stats/: `enum mthp_stat_item` in include/linux/huge_mm.h.
const MTHP: &[Field] = &[
    event("anon_fault_alloc").means("folios of this size allocated and charged for a page fault"),
    event("anon_fault_fallback")
        .means("page faults that failed to allocate or charge this size and tried a smaller one"),
    event("anon_fault_fallback_charge")
        .means("page faults that allocated this size but failed to charge it"),
    // A vendor counter of some builds of these VMs (anon_beside_full).
    event("anon_fault_declined")
        .means("faults that did not try this size (a vendor counter, not upstream)"),
    event("zswpout").means("folios of this size swapped out to zswap whole"),
    event("swpin").means("folios of this size swapped in whole from a swap device"),
    event("swpin_fallback")
        .means("swap-ins that failed to allocate or charge this size and used smaller folios"),
    event("swpin_fallback_charge")
        .means("swap-ins that allocated this size but failed to charge it"),
    event("swpout").means("folios of this size swapped out whole to a swap device"),
    event("swpout_fallback").means("folios of this size split before swap-out"),
    event("shmem_alloc").means("shmem folios of this size allocated"),
    event("shmem_fallback")
        .means("shmem allocations of this size that failed and used smaller folios"),
    event("shmem_fallback_charge").means("shmem folios of this size allocated but not charged"),
    event("split").means("folios of this size split into smaller ones"),
    bounded("split_failed", KernelAtLeastModel, SPLIT_ATTEMPTS)
        .means("splits of folios of this size that failed, e.g. because of a pin"),
    event("split_deferred")
        .means("folios of this size that became partially mapped (queued for deferred split)"),
    system_gauge("nr_anon", Unit::Folios)
        .means("anonymous folios of this size in the system, whole or partly mapped"),
    system_gauge("nr_anon_partially_mapped", Unit::Folios)
        .means("anonymous folios of this size partly unmapped and queued for deferred split"),
];

/// /proc/meminfo (`fs/proc/meminfo.c`, `hugetlb_report_meminfo`).
const MEMINFO: &[Field] = &[
    absolute("MemTotal", Unit::Kb).means("usable RAM"),
    system_gauge("MemFree", Unit::Kb).means("free RAM"),
    system_gauge("AnonPages", Unit::Kb).means("anonymous memory mapped into page tables"),
    system_gauge("AnonHugePages", Unit::Kb).means("anonymous memory in PMD-mapped THPs"),
    system_gauge("PageTables", Unit::Kb).means("memory in the lowest level of page tables"),
    absolute("HugePages_Total", Unit::HugePages)
        .means("pages in the pool of the default HugeTLB size"),
    absolute("HugePages_Free", Unit::HugePages).means("pages of that pool not yet allocated"),
    absolute("HugePages_Rsvd", Unit::HugePages)
        .means("pages of that pool reserved by a mapping but not yet faulted"),
    absolute("HugePages_Surp", Unit::HugePages)
        .means("pages of that pool above nr_hugepages (overcommit)"),
    absolute("Hugepagesize", Unit::Kb).means("the default HugeTLB page size"),
    absolute("Hugetlb", Unit::Kb).means("memory in HugeTLB pools of every size"),
];

/// /proc/PID/smaps fields (`fs/proc/task_mmu.c` `__show_smap`), in kB.
const SMAPS: &[Field] = &[
    absolute(SmapsField::Rss.name(), Unit::Kb).means("memory resident in the mappings"),
    absolute(SmapsField::Pss.name(), Unit::Kb)
        .means("Rss with each page divided by the number of processes mapping it"),
    absolute(SmapsField::SharedClean.name(), Unit::Kb)
        .means("clean pages mapped by more than one process"),
    absolute(SmapsField::SharedDirty.name(), Unit::Kb)
        .means("dirty pages mapped by more than one process"),
    absolute(SmapsField::PrivateClean.name(), Unit::Kb)
        .means("clean pages mapped by this process only"),
    absolute(SmapsField::PrivateDirty.name(), Unit::Kb)
        .means("dirty pages mapped by this process only"),
    absolute(SmapsField::Anonymous.name(), Unit::Kb)
        .means("resident anonymous memory (no file behind it)"),
    absolute(SmapsField::LazyFree.name(), Unit::Kb)
        .means("memory MADV_FREE marked lazily freeable and still clean"),
    absolute(SmapsField::AnonHugePages.name(), Unit::Kb)
        .means("anonymous memory mapped by PMDs (PMD THPs)"),
    Field {
        bound: Some(Bound {
            kind: SumWith(SmapsField::PrivateHugetlb.name()),
            why: HUGETLB_PMD_SHARED,
        }),
        ..absolute(SmapsField::SharedHugetlb.name(), Unit::Kb).means("HugeTLB memory mapped shared")
    },
    Field {
        bound: Some(Bound {
            kind: SumWith(SmapsField::SharedHugetlb.name()),
            why: HUGETLB_PMD_SHARED,
        }),
        ..absolute(SmapsField::PrivateHugetlb.name(), Unit::Kb)
            .means("HugeTLB memory mapped privately")
    },
];

/// Why smaps' two HugeTLB fields are compared by their sum.
const HUGETLB_PMD_SHARED: &str = "smaps_hugetlb_range counts a HugeTLB page as shared when hugetlb_pmd_shared() finds the refcount of the page-table page holding its entry above 1; for a 1 GiB page that is the PUD table page, which on these kernels reads above 1 in a process of its own (a page mapped once shows as Shared_Hugetlb, in most runs but not all), so only the sum is the workload's";

/// The folios of a region, counted from pagemap and kpageflags.
const FOLIOS: &[Field] = &[absolute("folios", Unit::Folios)
    .means("folios of the size mapped in the region (all, by PTEs, or by a PMD)")];

/// /proc/PID/stat field 10, counted over the workload's own accesses.
const STAT: &[Field] = &[event("minflt").means("minor faults: faults served without I/O")];

const KHUGEPAGED: &[Field] = &[
    event("pages_collapsed").means("PMD THPs khugepaged made by collapsing a range"),
    event("full_scans").means("passes khugepaged completed over every registered mm"),
];

/// hugepages/hugepages-<size>/ (`mm/hugetlb_sysfs.c`).
const HUGETLB: &[Field] = &[
    absolute("nr_hugepages", Unit::HugePages).means("persistent pages in the pool"),
    absolute("free_hugepages", Unit::HugePages).means("pages of the pool not allocated"),
    absolute("resv_hugepages", Unit::HugePages)
        .means("pages reserved by a mapping but not yet faulted"),
    absolute("surplus_hugepages", Unit::HugePages)
        .means("pages allocated above nr_hugepages (overcommit)"),
    absolute("nr_overcommit_hugepages", Unit::HugePages)
        .means("how many surplus pages may be allocated"),
];

/// memory.<file> of the cgroup (v2 names; v1's usage_in_bytes,
/// max_usage_in_bytes and limit_in_bytes are read as current, peak and
/// max), in kB. The kernel's usage also holds the per-cpu charge stock and
/// kernel memory the model does not charge: `diff` compares current and
/// peak with that bound.
const MEMCG: &[Field] = &[
    Field {
        bound: Some(Bound {
            kind: KernelAboveModelBy(MEMCG_SLACK_KB),
            why: MEMCG_STOCK,
        }),
        ..absolute("current", Unit::Kb).means("memory charged to the cgroup now")
    },
    Field {
        bound: Some(Bound {
            kind: KernelAboveModelBy(MEMCG_SLACK_KB),
            why: MEMCG_STOCK,
        }),
        ..absolute("peak", Unit::Kb).means("the most memory charged to the cgroup at once")
    },
    absolute("max", Unit::Kb).means("the cgroup's limit (memory.max)"),
    // The agent's own charge, measured when it joined (kernel backend only).
    absolute("agent", Unit::Kb)
        .means("the kernel backend's agent's own charge when it joined (kernel backend only)"),
];

/// memory.events of the cgroup (`enum memcg_memory_event`): v2's
/// memory.events; v1 has only oom_kill (memory.oom_control).
const MEMCG_EVENTS: &[Field] = &[
    // MEMCG_MAX is raised once per pass of try_charge_memcg's retry loop.
    bounded("max", KernelAtLeastModel, MEMCG_MAX_PASSES)
        .means("times a charge hit memory.max and had to reclaim"),
    event("oom").means("times the cgroup ran out of memory at memory.max"),
    event("oom_kill").means("processes the OOM killer killed in the cgroup"),
];

/// How far above the model the kernel's memory.current may read, in kB.
pub const MEMCG_SLACK_KB: i64 = 1024;
const MEMCG_STOCK: &str = "the kernel charges in batches of MEMCG_CHARGE_BATCH (64 pages) and keeps the rest in a per-cpu stock that memory.current counts (256 kB per CPU that charged), and charges kernel memory the model does not (VMAs, anon_vmas, slab pages: tens of kB): the kernel reads at least the model and at most 1024 kB above it";
const MEMCG_MAX_PASSES: &str = "MEMCG_MAX counts passes of try_charge_memcg's retry loop, and the kernel's batch charge and drain_all_stock can add passes";

use Part::{Choice, Field as F, Lit, Proc, Region, Size};

/// Every family, in the order documentation lists them.
pub static FAMILIES: &[Family] = &[
    Family {
        name: "vmstat",
        pattern: "vmstat.<field>",
        scope: Scope::System,
        source: "/proc/vmstat",
        shapes: &[&[Lit("vmstat"), F]],
        fields: VMSTAT,
    },
    Family {
        name: "mthp",
        pattern: "mthp.<size>.<stat>",
        scope: Scope::System,
        source: "/sys/kernel/mm/transparent_hugepage/hugepages-<size>/stats/<stat>",
        shapes: &[&[Lit("mthp"), Size, F]],
        fields: MTHP,
    },
    Family {
        name: "meminfo",
        pattern: "meminfo.<field>",
        scope: Scope::System,
        source: "/proc/meminfo",
        shapes: &[&[Lit("meminfo"), F]],
        fields: MEMINFO,
    },
    Family {
        name: "smaps",
        pattern: "smaps.<proc>[.<region>].<field>",
        scope: Scope::Process,
        source: "/proc/PID/smaps, summed over the process's regions or one region's VMAs",
        shapes: &[&[Lit("smaps"), Proc, F], &[Lit("smaps"), Proc, Region, F]],
        fields: SMAPS,
    },
    Family {
        name: "folios",
        pattern: "folios.<proc>.<region>.<size>[.pte|.pmd]",
        scope: Scope::Process,
        // Folios of <size> mapped in the region: all of them, or those mapped
        // by PTEs, or by a PMD.
        source: "/proc/PID/pagemap (PAGEMAP_SCAN) and /proc/kpageflags",
        shapes: &[
            &[Lit("folios"), Proc, Region, Size],
            &[Lit("folios"), Proc, Region, Size, Choice(&["pte", "pmd"])],
        ],
        fields: FOLIOS,
    },
    Family {
        name: "stat",
        pattern: "stat.<proc>.minflt",
        scope: Scope::Process,
        source: "/proc/PID/stat field 10 (minflt), over the workload's accesses",
        shapes: &[&[Lit("stat"), Proc, F]],
        fields: STAT,
    },
    Family {
        name: "khugepaged",
        pattern: "khugepaged.<field>",
        scope: Scope::System,
        source: "/sys/kernel/mm/transparent_hugepage/khugepaged/<field>",
        shapes: &[&[Lit("khugepaged"), F]],
        fields: KHUGEPAGED,
    },
    Family {
        name: "hugetlb",
        pattern: "hugetlb.<size>.<file>",
        scope: Scope::System,
        source: "/sys/kernel/mm/hugepages/hugepages-<size>/<file>",
        shapes: &[&[Lit("hugetlb"), Size, F]],
        fields: HUGETLB,
    },
    Family {
        name: "memcg",
        pattern: "memcg.<cg>.memory.<file>",
        scope: Scope::Cgroup,
        source: "memory.<file> of the cgroup (v2), or its v1 equivalent",
        shapes: &[&[Lit("memcg"), Part::Cgroup, Lit("memory"), F]],
        fields: MEMCG,
    },
    Family {
        name: "memcg",
        pattern: "memcg.<cg>.memory.events.<field>",
        scope: Scope::Cgroup,
        source: "memory.events of the cgroup (v2), or v1 memory.oom_control's oom_kill",
        shapes: &[&[Lit("memcg"), Part::Cgroup, Lit("memory"), Lit("events"), F]],
        fields: MEMCG_EVENTS,
    },
];

/// A counter name resolved against the registry.
#[derive(Clone, Copy, Debug)]
pub struct Counter<'a> {
    pub family: &'static Family,
    pub field: &'static Field,
    pub proc: Option<&'a str>,
    pub region: Option<&'a str>,
    pub cgroup: Option<&'a str>,
    pub size_kb: Option<u64>,
}

/// `<n>kB` with n a power of two.
fn size_kb(s: &str) -> Option<u64> {
    let n: u64 = s.strip_suffix("kB")?.parse().ok()?;
    (n.is_power_of_two() && !s.starts_with('0')).then_some(n)
}

/// The registry entry of `name`, if a family describes it.
pub fn lookup(name: &str) -> Option<Counter<'_>> {
    let parts: Vec<&str> = name.split('.').collect();
    FAMILIES.iter().find_map(|family| {
        family
            .shapes
            .iter()
            .find_map(|shape| match_shape(family, shape, &parts))
    })
}

fn match_shape<'a>(
    family: &'static Family,
    shape: &[Part],
    parts: &[&'a str],
) -> Option<Counter<'a>> {
    if parts.len() != shape.len() {
        return None;
    }
    let mut c = Counter {
        family,
        field: &family.fields[0],
        proc: None,
        region: None,
        cgroup: None,
        size_kb: None,
    };
    for (part, text) in shape.iter().zip(parts) {
        match part {
            Lit(l) if l == text => {}
            Proc if valid_name(text) => c.proc = Some(text),
            Region if valid_name(text) => c.region = Some(text),
            Part::Cgroup if valid_name(text) => c.cgroup = Some(text),
            Size => c.size_kb = Some(size_kb(text)?),
            Choice(words) if words.contains(text) => {}
            F => c.field = family.fields.iter().find(|f| f.name == *text)?,
            _ => return None,
        }
    }
    Some(c)
}

/// Why a name is not a counter, with the nearest known name when there is
/// one close enough to be the one meant.
pub fn unknown_counter_message(name: &str) -> String {
    match suggest(name) {
        Some(s) => format!("unknown counter '{name}'; did you mean {s}?"),
        None => {
            let families: Vec<&str> = FAMILIES.iter().map(|f| f.pattern).collect();
            format!(
                "unknown counter '{name}'; counters are named {}",
                families.join(", ")
            )
        }
    }
}

/// Edit distance, case differences counting half (rounded up).
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let exact = strsim::levenshtein(a, b);
    let folded = strsim::levenshtein(&a.to_lowercase(), &b.to_lowercase());
    exact.min(folded + (exact - folded).div_ceil(2).min(1))
}

/// The nearest name a family describes: every fixed part and field replaced
/// by the nearest allowed word, the process, region, cgroup and size parts
/// kept as written.
pub fn suggest(name: &str) -> Option<String> {
    let parts: Vec<&str> = name.split('.').collect();
    let mut best: Option<(usize, String)> = None;
    for family in FAMILIES {
        for shape in family.shapes {
            let Some((cost, text)) = nearest_in_shape(family, shape, &parts) else {
                continue;
            };
            if best.as_ref().is_none_or(|(c, _)| cost < *c) {
                best = Some((cost, text));
            }
        }
    }
    best.filter(|(cost, _)| *cost > 0 && is_typo(*cost, name))
        .map(|(_, text)| text)
}

/// Whether `cost` edits (see [`distance`]) make `name` a typo of the other
/// name rather than another name: at most a third of it changed.
pub(crate) fn is_typo(cost: usize, name: &str) -> bool {
    cost <= (name.len() / 3).max(2)
}

fn nearest_word<'w>(text: &str, words: impl Iterator<Item = &'w str>) -> (usize, &'w str) {
    words
        .map(|w| (distance(text, w), w))
        .min_by_key(|(d, _)| *d)
        .unwrap_or((usize::MAX / 4, ""))
}

fn nearest_in_shape(family: &Family, shape: &[Part], parts: &[&str]) -> Option<(usize, String)> {
    if parts.len() != shape.len() {
        return None;
    }
    let mut cost = 0;
    let mut out = Vec::new();
    for (part, &text) in shape.iter().zip(parts) {
        let (c, word) = match part {
            Lit(l) => (distance(text, l), *l),
            Choice(words) => nearest_word(text, words.iter().copied()),
            F => nearest_word(text, family.fields.iter().map(|f| f.name)),
            Size if size_kb(text).is_some() => (0, text),
            Size => return None,
            Proc | Region | Part::Cgroup if valid_name(text) => (0, text),
            Proc | Region | Part::Cgroup => return None,
        };
        cost += c;
        out.push(word.to_string());
    }
    Some((cost, out.join(".")))
}

/// The bound `diff` applies to `name`, if it counts attempts or is
/// compared by a sum.
pub fn bound(name: &str) -> Option<Bound> {
    lookup(name)?.field.bound
}

/// For a counter compared by its sum with another ([`BoundKind::SumWith`]):
/// the other counter's name (`vmstat.nr_memmap_pages` →
/// `vmstat.nr_memmap_boot_pages`).
pub fn sum_partner(name: &str) -> Option<String> {
    let BoundKind::SumWith(field) = bound(name)?.kind else {
        return None;
    };
    let (owner, _) = name.rsplit_once('.')?;
    Some(format!("{owner}.{field}"))
}

/// The names of a family's fields, for readers that list what to read.
pub fn field_names(family: &'static str) -> impl Iterator<Item = &'static str> {
    FAMILIES
        .iter()
        .filter(move |f| f.name == family)
        .flat_map(|f| f.fields.iter().map(|field| field.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The smaps family lists exactly the fields both backends report, in
    /// their order.
    #[test]
    fn the_smaps_family_is_smaps_field_all() {
        let names: Vec<&str> = SMAPS.iter().map(|f| f.name).collect();
        let all: Vec<&str> = SmapsField::ALL.iter().map(|f| f.name()).collect();
        assert_eq!(names, all);
    }

    #[test]
    fn every_shape_of_every_family_resolves() {
        for name in [
            "vmstat.thp_fault_alloc",
            "vmstat.nr_anon_pages",
            "mthp.64kB.anon_fault_alloc",
            "mthp.2048kB.nr_anon",
            "meminfo.AnonHugePages",
            "smaps.a.Rss",
            "smaps.a.buf.AnonHugePages",
            "folios.a.buf.64kB",
            "folios.a.buf.2048kB.pmd",
            "folios.a.buf-2.4kB.pte",
            "stat.child_1.minflt",
            "khugepaged.pages_collapsed",
            "hugetlb.2048kB.nr_hugepages",
            "memcg.cg1.memory.peak",
        ] {
            assert!(lookup(name).is_some(), "{name}");
        }
    }

    #[test]
    fn names_no_family_describes_are_refused() {
        for name in [
            "vmstat.thp_faul_alloc",
            "vmstat",
            "mthp.60kB.anon_fault_alloc",
            "mthp.64K.anon_fault_alloc",
            "smaps.a.b.c.Rss",
            "folios.a.buf.64kB.pud",
            "memcg.cg1.peak",
            "errno",
        ] {
            assert!(lookup(name).is_none(), "{name}");
        }
    }

    #[test]
    fn kinds_units_and_bounds() {
        let c = lookup("vmstat.pgfault").unwrap();
        assert_eq!(
            (c.field.kind, c.field.unit),
            (CounterKind::Event, Unit::Count)
        );
        let c = lookup("smaps.p.r.Pss").unwrap();
        assert_eq!((c.proc, c.region), (Some("p"), Some("r")));
        assert_eq!(c.field.reported, Reported::Absolute);
        let c = lookup("mthp.16kB.split_failed").unwrap();
        assert_eq!(c.size_kb, Some(16));
        assert_eq!(c.field.bound.unwrap().kind, KernelAtLeastModel);
        assert_eq!(c.family.scope, Scope::System);
        assert_eq!(lookup("memcg.g.memory.current").unwrap().cgroup, Some("g"));
    }

    #[test]
    fn typos_get_the_nearest_name() {
        assert_eq!(
            suggest("vmstat.thp_faul_alloc").as_deref(),
            Some("vmstat.thp_fault_alloc")
        );
        assert_eq!(
            suggest("smaps.a.buf.anonhugepages").as_deref(),
            Some("smaps.a.buf.AnonHugePages")
        );
        assert_eq!(
            suggest("mthp.64kB.anon_fault_aloc").as_deref(),
            Some("mthp.64kB.anon_fault_alloc")
        );
        assert_eq!(suggest("vmsat.pgfault").as_deref(), Some("vmstat.pgfault"));
        assert_eq!(
            suggest("memcg.g.memory.peek").as_deref(),
            Some("memcg.g.memory.peak")
        );
        assert_eq!(suggest("something.else.entirely"), None);
        let m = unknown_counter_message("bogus");
        assert!(m.contains("vmstat.<field>"), "{m}");
    }

    #[test]
    fn memmap_counters_are_compared_by_their_sum() {
        assert_eq!(
            sum_partner("vmstat.nr_memmap_pages").as_deref(),
            Some("vmstat.nr_memmap_boot_pages")
        );
        assert_eq!(
            sum_partner("vmstat.nr_memmap_boot_pages").as_deref(),
            Some("vmstat.nr_memmap_pages")
        );
        assert_eq!(sum_partner("vmstat.pgfault"), None);
        assert_eq!(sum_partner("vmstat.thp_split_page_failed"), None);
        // Every partner is a field of the same family, pointing back.
        for f in FAMILIES {
            for x in f.fields {
                if let Some(Bound {
                    kind: SumWith(other),
                    ..
                }) = x.bound
                {
                    let o = f.fields.iter().find(|y| y.name == other).unwrap();
                    assert_eq!(o.bound.unwrap().kind, SumWith(x.name), "{}", x.name);
                    assert_eq!((o.kind, o.unit), (x.kind, x.unit), "{}", x.name);
                }
            }
        }
    }

    #[test]
    fn every_field_says_what_it_means_in_one_short_line() {
        for f in FAMILIES {
            for x in f.fields {
                assert!(!x.what.is_empty(), "{}.{} has no meaning", f.name, x.name);
                assert!(x.what.len() <= 80, "{}.{}: {}", f.name, x.name, x.what);
            }
        }
    }

    /// deferred_split_folio (mm/huge_memory.c) counts THP_DEFERRED_SPLIT_PAGE
    /// and MTHP_STAT_SPLIT_DEFERRED only when `partially_mapped` is true and
    /// the folio was not flagged partially mapped yet: a THP queued at fault
    /// for the under-used check counts in neither.
    #[test]
    fn the_deferred_split_counters_count_folios_that_became_partially_mapped() {
        let what = |family: &str, name: &str| {
            let f = FAMILIES.iter().find(|f| f.name == family).unwrap();
            f.fields.iter().find(|x| x.name == name).unwrap().what
        };
        for w in [
            what("vmstat", "thp_deferred_split_page"),
            what("mthp", "split_deferred"),
        ] {
            assert!(w.contains("became partially mapped"), "{w}");
            assert!(!w.contains("under-use"), "{w}");
        }
    }

    #[test]
    fn field_names_are_unique_per_family() {
        for f in FAMILIES {
            let mut names: Vec<_> = f.fields.iter().map(|f| f.name).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), f.fields.len(), "{}", f.name);
        }
    }
}
