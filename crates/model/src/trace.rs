//! The model's tracepoints: each fault's decisions, in the order the kernel
//! takes them, so `hugelab explain` can say why a fault got the folio size
//! it got. Recording is off (one branch per decision) unless a caller turns
//! it on with [`Machine::start_trace`].
//!
//! The steps are named after the kernel functions that decide
//! (mm/memory.c `alloc_anon_folio`, mm/huge_memory.c
//! `thp_vma_allowable_orders` and `do_huge_pmd_anonymous_page`,
//! mm/page_alloc.c `__alloc_pages`, mm/compaction.c, mm/memcontrol.c
//! `mem_cgroup_charge`); Linux has tracepoints for some (`mm_page_alloc`,
//! `mm_compaction_end`) and none for the order choice itself.

use crate::gfp::Gfp;
use crate::Machine;
use serde::Serialize;

/// One decision of one fault.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// thp_vma_allowable_orders: the orders (bit mask) the tunables and the
    /// VMA allow for this fault's path, and, per order left out, why.
    Allowable {
        pmd: bool,
        orders: u32,
        denied: Vec<(u32, Denial)>,
    },
    /// thp_vma_suitable_orders: the orders whose aligned range fits the VMA.
    Suitable { orders: u32, unsuitable: u32 },
    /// alloc_anon_folio's pte_range_none check: a populated PTE in the
    /// aligned range rules the order (and, the kernel stops there, nothing
    /// smaller) out.
    PtesPopulated { order: u32 },
    /// A read fault maps the shared zero page (order 0) or the huge zero
    /// folio (PMD).
    ZeroPage { huge: bool },
    /// __alloc_pages fast path: a free block of the order, or none.
    Alloc { order: u32, gfp: Gfp, ok: bool },
    /// __alloc_pages_direct_compact (mm/compaction.c try_to_compact_pages).
    Compact {
        order: u32,
        sync: bool,
        result: CompactResult,
    },
    /// wakeup_kcompactd: the allocation failed fast and woke kcompactd.
    WakeKcompactd { order: u32 },
    /// mem_cgroup_charge of the allocated folio: `reclaimed` pages the
    /// limit reclaim freed first; `ok` false is a charge failure.
    Charge {
        order: u32,
        memcg: String,
        ok: bool,
        reclaimed: u64,
    },
    /// The order failed; the named counters were incremented.
    Fallback {
        order: u32,
        counters: Vec<&'static str>,
    },
    /// The folio the fault mapped (order 0: a base page).
    Mapped { order: u32 },
    /// No page at all: VM_FAULT_OOM (and, under a memcg, its OOM killer).
    Oom,
}

/// Why thp_vma_allowable_orders leaves an order out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Denial {
    /// hugepages-<size>kB/enabled is never (or inherit while the top-level
    /// enabled is never).
    SizeNever,
    /// The size (or the inherited top-level) is madvise and the VMA has no
    /// MADV_HUGEPAGE.
    NotMadvised,
    /// MADV_NOHUGEPAGE on the VMA (VM_NOHUGEPAGE).
    VmNoHugepage,
    /// prctl(PR_SET_THP_DISABLE) on the process (MMF_DISABLE_THP).
    ProcessDisabled,
}

/// compact_result, as far as the fault sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CompactResult {
    /// COMPACT_SUCCESS: a free block of the order exists now.
    Success,
    /// COMPACT_COMPLETE / COMPACT_PARTIAL_SKIPPED: scanned, no block made.
    Fail,
    /// COMPACT_DEFERRED: compaction recently failed at this order and is
    /// skipped (defer_compaction / compaction_deferred).
    Deferred,
    /// COMPACT_SKIPPED: not enough free memory to compact into.
    Skipped,
}

/// One fault and its steps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaultTrace {
    pub addr: u64,
    pub write: bool,
    pub steps: Vec<Step>,
}

/// What a traced run recorded, fault by fault.
#[derive(Default)]
pub struct Trace {
    pub faults: Vec<FaultTrace>,
}

impl Machine {
    /// Starts recording faults (clearing what was recorded).
    pub fn start_trace(&mut self) {
        self.trace = Some(Box::default());
    }

    /// Stops recording and returns what was recorded.
    pub fn take_trace(&mut self) -> Option<Trace> {
        self.trace.take().map(|t| *t)
    }

    /// Whether faults are being recorded (the fast paths step aside).
    #[inline]
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// A new fault begins.
    #[inline]
    pub fn trace_fault(&mut self, addr: u64, write: bool) {
        if let Some(t) = &mut self.trace {
            t.faults.push(FaultTrace {
                addr,
                write,
                steps: Vec::new(),
            });
        }
    }

    /// One decision of the current fault; `step` is built only when tracing.
    #[inline]
    pub fn trace(&mut self, step: impl FnOnce() -> Step) {
        if let Some(t) = &mut self.trace {
            if let Some(f) = t.faults.last_mut() {
                f.steps.push(step());
            }
        }
    }
}
