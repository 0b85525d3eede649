//! The model's tracepoints: each fault's decisions, in the order the kernel
//! takes them (one exception: a memcg OOM kill, which the kernel runs
//! inside the charge, is recorded after the charge step), so `hugelab explain` can say why a fault got the folio size
//! it got. Recording is off (one branch per decision) unless a caller turns
//! it on with [`Machine::start_trace`].
//!
//! No kernel file: hugelab's record of the decisions. The steps are named
//! after the Linux 6.18 functions that decide (mm/memory.c `alloc_anon_folio`, mm/huge_memory.c
//! `thp_vma_allowable_orders` and `do_huge_pmd_anonymous_page`,
//! mm/page_alloc.c `__alloc_pages`, mm/compaction.c, mm/memcontrol.c
//! `mem_cgroup_charge`); Linux has tracepoints for some (`mm_page_alloc`,
//! `mm_compaction_end`) and none for the order choice itself.
//!
//! Collapses are recorded too, outside faults: every PMD range khugepaged
//! or MADV_COLLAPSE scanned (mm/khugepaged.c `hpage_collapse_scan_pmd`,
//! what it counted and its `enum scan_result`), the collapse that followed
//! (`collapse_huge_page`), the VMAs passed over and why, and what
//! `madvise_collapse` returned. Linux's `mm_khugepaged_scan_pmd` and
//! `mm_collapse_huge_page` tracepoints say about as much.

use crate::gfp::Gfp;
use crate::vmstat::Counted;
use crate::Machine;
use hugelab_workload::Errno;
use serde::Serialize;
use std::fmt::Write;

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
    /// The order failed; these counters were incremented.
    Fallback { order: u32, counters: Vec<Counted> },
    /// The folio the fault mapped (order 0: a base page).
    Mapped { order: u32 },
    /// A write to a write-protected mapping (do_wp_page, do_huge_pmd_wp_page,
    /// do_huge_zero_wp_pmd): the page or THP `reused` in place, or not (a
    /// copy at the PTE level; for a PMD, after splitting it).
    Wp {
        huge: bool,
        zero: bool,
        reused: bool,
    },
    /// No page at all: VM_FAULT_OOM.
    Oom,
    /// mem_cgroup_out_of_memory: select_bad_process chose `victim` (None:
    /// the faulting process) for its `points` (oom_badness, in pages) and
    /// oom_kill_process sent it SIGKILL.
    OomKill {
        memcg: String,
        victim: Option<String>,
        points: u64,
    },
}

/// Why thp_vma_allowable_orders leaves an order out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Denial {
    /// hugepages-<size>kB/enabled is never.
    SizeNever,
    /// hugepages-<size>kB/enabled is inherit and the top-level enabled never.
    InheritNever,
    /// The size (or the top-level enabled it inherits) is madvise and the
    /// VMA has no MADV_HUGEPAGE.
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

/// Who collapses a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Collapser {
    /// The khugepaged thread (khugepaged_scan_mm_slot), under its limits.
    Khugepaged,
    /// madvise(MADV_COLLAPSE) (madvise_collapse), without them.
    MadviseCollapse,
}

/// What hpage_collapse_scan_pmd counted in a range's PTE table before it
/// stopped: at the first PTE over a limit, or at the end.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct ScanCounts {
    /// PTEs looked at (512 when the scan went through).
    pub ptes: u64,
    /// pte_none or the zero page.
    pub none_or_zero: u64,
    /// Pages whose folio is maybe mapped shared.
    pub shared: u64,
    /// khugepaged's max_ptes_none and max_ptes_shared; `None` for
    /// MADV_COLLAPSE, which applies neither.
    pub max_ptes_none: Option<u64>,
    pub max_ptes_shared: Option<u64>,
}

/// Why a collapse passed over (khugepaged) or refused (MADV_COLLAPSE,
/// EINVAL) a whole VMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VmaVerdict {
    /// thp_vma_allowable_order: the tunables, MADV_NOHUGEPAGE or
    /// PR_SET_THP_DISABLE rule the PMD order out.
    NotAllowed,
    /// No anon_vma: nothing but read faults (the zero page) so far.
    NoAnonVma,
    /// No naturally aligned 2M range fits in the VMA.
    NoAlignedRange,
}

/// One thing a collapse did, in the order it did it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum CollapseStep {
    /// khugepaged_do_scan did nothing: hugepage_pmd_enabled is false (the
    /// PMD size is disabled, so the thread is stopped).
    Stopped,
    /// A VMA passed over (khugepaged) or refused (MADV_COLLAPSE).
    Vma {
        by: Collapser,
        mm_id: u32,
        start: u64,
        end: u64,
        verdict: VmaVerdict,
    },
    /// A PMD range: hpage_collapse_scan_pmd's result and counts, then, if
    /// it qualified, collapse_huge_page's result and gfp.
    Range {
        by: Collapser,
        mm_id: u32,
        haddr: u64,
        scan: Scan,
        counts: Option<ScanCounts>,
        collapse: Option<(Gfp, Scan)>,
    },
    /// madvise_collapse returned: 0, or the errno madvise_collapse_errno
    /// gives for the last failure.
    Return {
        mm_id: u32,
        last_fail: Option<Scan>,
        errno: Option<Errno>,
    },
}

/// What a traced run recorded, fault by fault.
#[derive(Default)]
pub struct Trace {
    pub faults: Vec<FaultTrace>,
    /// What khugepaged and MADV_COLLAPSE did, in order.
    pub collapses: Vec<CollapseStep>,
    /// Inside a fault: allocations elsewhere (khugepaged, MADV_COLLAPSE)
    /// belong to no fault and are not recorded.
    in_fault: bool,
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
            t.in_fault = true;
            t.faults.push(FaultTrace {
                addr,
                write,
                steps: Vec::new(),
            });
        }
    }

    /// The current fault is handled.
    #[inline]
    pub fn trace_fault_end(&mut self) {
        if let Some(t) = &mut self.trace {
            t.in_fault = false;
        }
    }

    /// One step of a collapse; `step` is built only when tracing.
    #[inline]
    pub fn trace_collapse(&mut self, step: impl FnOnce() -> CollapseStep) {
        if let Some(t) = &mut self.trace {
            t.collapses.push(step());
        }
    }

    /// One decision of the current fault; `step` is built only when tracing.
    #[inline]
    pub fn trace(&mut self, step: impl FnOnce() -> Step) {
        if let Some(t) = &mut self.trace {
            if let (true, Some(f)) = (t.in_fault, t.faults.last_mut()) {
                f.steps.push(step());
            }
        }
    }
}

/// A folio size as people say it: 4K, 64K, 2M.
pub fn size_name(order: u32) -> String {
    let kb = 4u64 << order;
    if kb >= 1024 {
        format!("{}M", kb / 1024)
    } else {
        format!("{kb}K")
    }
}

/// The sizes of an order mask, largest first: "64K,32K".
fn sizes(orders: u32) -> String {
    let mut v: Vec<String> = (0..32)
        .rev()
        .filter(|o| orders & (1 << o) != 0)
        .map(size_name)
        .collect();
    if v.is_empty() {
        v.push("none".into());
    }
    v.join(",")
}

impl Denial {
    fn describe(self) -> &'static str {
        match self {
            Denial::SizeNever => "hugepages-<size>kB/enabled never",
            Denial::InheritNever => "hugepages-<size>kB/enabled inherit, enabled never",
            Denial::NotMadvised => "madvise, and the VMA has no MADV_HUGEPAGE",
            Denial::VmNoHugepage => "MADV_NOHUGEPAGE",
            Denial::ProcessDisabled => "PR_SET_THP_DISABLE",
        }
    }
}

impl CompactResult {
    fn describe(self) -> &'static str {
        match self {
            CompactResult::Success => "COMPACT_SUCCESS",
            CompactResult::Fail => "COMPACT_COMPLETE, no block",
            CompactResult::Deferred => "COMPACT_DEFERRED",
            CompactResult::Skipped => "COMPACT_SKIPPED",
        }
    }
}

impl Step {
    /// One decision in words, named after the kernel function that takes it.
    pub fn describe(&self) -> String {
        let mut s = String::new();
        match self {
            Step::Allowable {
                pmd,
                orders,
                denied,
            } => s = describe_allowable(*pmd, *orders, denied),
            Step::Suitable { orders, unsuitable } => {
                let _ = write!(s, "thp_vma_suitable_orders: ");
                if *unsuitable != 0 {
                    let _ = write!(s, "{} cross the VMA's bounds", sizes(*unsuitable));
                    if *orders != 0 {
                        let _ = write!(s, ", {} fit", sizes(*orders));
                    }
                } else {
                    let _ = write!(s, "{} fit", sizes(*orders));
                }
            }
            Step::PtesPopulated { order } => {
                let _ = write!(
                    s,
                    "pte_range_none: the {} range has a populated PTE",
                    size_name(*order)
                );
            }
            Step::ZeroPage { huge: false } => s.push_str("read fault: the shared zero page"),
            Step::ZeroPage { huge: true } => s.push_str("read fault: the huge zero folio"),
            Step::Alloc { order, gfp, ok } => {
                let _ = write!(
                    s,
                    "__alloc_pages(order {order}, {}): {}",
                    gfp.describe(),
                    if *ok { "ok" } else { "no free block" }
                );
            }
            Step::Compact {
                order,
                sync,
                result,
            } => {
                let _ = write!(
                    s,
                    "try_to_compact_pages(order {order}, {}): {}",
                    if *sync { "sync-light" } else { "async" },
                    result.describe()
                );
            }
            Step::WakeKcompactd { order } => {
                let _ = write!(s, "wakeup_kcompactd(order {order})");
            }
            Step::Charge {
                order,
                memcg,
                ok,
                reclaimed,
            } => {
                let _ = write!(s, "mem_cgroup_charge({} to {memcg}): ", size_name(*order));
                if *reclaimed > 0 {
                    let _ = write!(s, "reclaimed {reclaimed} pages, ");
                }
                s.push_str(if *ok { "ok" } else { "over memory.max" });
            }
            Step::Fallback { order, counters } => {
                let _ = write!(
                    s,
                    "{} falls back ({})",
                    size_name(*order),
                    counters
                        .iter()
                        .map(|c| c.name())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Step::Mapped { order } => {
                let _ = write!(s, "mapped a {} folio", size_name(*order));
            }
            Step::Wp { huge, zero, reused } => {
                let what = match (huge, zero) {
                    (true, true) => "do_huge_zero_wp_pmd",
                    (true, false) => "do_huge_pmd_wp_page",
                    (false, _) => "do_wp_page",
                };
                let _ = write!(
                    s,
                    "{what}: {}",
                    match (huge, zero, reused) {
                        (_, _, true) => "reused in place",
                        (true, true, false) =>
                            "a new THP in place of the huge zero PMD, or a split",
                        (true, false, false) => "PMD split, the write retried at the PTE level",
                        (false, _, false) => "copied into a new page",
                    }
                );
            }
            Step::Oom => s.push_str("no page: VM_FAULT_OOM"),
            Step::OomKill {
                memcg,
                victim,
                points,
            } => {
                let who = victim.as_deref().unwrap_or("the faulting process");
                let _ = write!(
                    s,
                    "mem_cgroup_out_of_memory({memcg}): select_bad_process chose {who} \
                     (oom_badness {points} pages), SIGKILL"
                );
            }
        }
        s
    }
}

/// `Step::Allowable` in words: the sizes allowed, then one clause per
/// reason with its sizes together.
fn describe_allowable(pmd: bool, orders: u32, denied: &[(u32, Denial)]) -> String {
    let what = if pmd { "PMD" } else { "mTHP" };
    let mut s = format!("thp_vma_allowable_orders ({what}): ");
    if orders != 0 {
        let _ = write!(s, "{} allowed", sizes(orders));
    } else {
        s.push_str("none allowed");
    }
    let mut reasons: Vec<(Denial, u32)> = Vec::new();
    for (o, d) in denied {
        match reasons.iter_mut().find(|(r, _)| r == d) {
            Some((_, mask)) => *mask |= 1 << o,
            None => reasons.push((*d, 1 << o)),
        }
    }
    for (d, mask) in reasons {
        let _ = write!(s, "; {}: {}", sizes(mask), d.describe());
    }
    s
}

impl VmaVerdict {
    fn describe(self) -> &'static str {
        match self {
            VmaVerdict::NotAllowed => "thp_vma_allowable_order: the PMD order is not allowed",
            VmaVerdict::NoAnonVma => "no anon_vma (only read faults so far)",
            VmaVerdict::NoAlignedRange => "no aligned 2M range fits in it",
        }
    }
}

impl Collapser {
    /// The kernel function that drives it.
    pub fn name(self) -> &'static str {
        match self {
            Collapser::Khugepaged => "khugepaged",
            Collapser::MadviseCollapse => "madvise_collapse",
        }
    }
}

impl CollapseStep {
    /// The step in words, named after the kernel functions and results;
    /// `at` names an address of the step's mm (`proc region+offset`).
    pub fn describe(&self, at: impl Fn(u32, u64) -> String) -> Vec<String> {
        match self {
            CollapseStep::Stopped => vec![
                "khugepaged_do_scan: hugepage_pmd_enabled is false (the PMD size is disabled): \
                 the thread does not run"
                    .into(),
            ],
            CollapseStep::Vma {
                by,
                mm_id,
                start,
                end,
                verdict,
            } => {
                let what = match by {
                    Collapser::Khugepaged => "khugepaged_scan_mm_slot passes over the VMA",
                    Collapser::MadviseCollapse => "madvise_collapse refuses the VMA (EINVAL)",
                };
                vec![format!(
                    "{what} at {} ({}): {}",
                    at(*mm_id, *start),
                    hugelab_workload::Size(end - start),
                    verdict.describe()
                )]
            }
            CollapseStep::Range {
                scan,
                counts,
                collapse,
                ..
            } => {
                let mut v = vec![describe_scan(*scan, counts.as_ref())];
                if let Some((gfp, result)) = collapse {
                    let outcome = match result {
                        Scan::Succeed => "SCAN_SUCCEED: the range is now one 2M THP".to_string(),
                        Scan::AllocHugePageFail => {
                            "no free 2M block: SCAN_ALLOC_HUGE_PAGE_FAIL (thp_collapse_alloc_failed)"
                                .to_string()
                        }
                        Scan::CgroupChargeFail => {
                            "the charge failed: SCAN_CGROUP_CHARGE_FAIL".to_string()
                        }
                        other => other.name().to_string(),
                    };
                    v.push(format!(
                        "collapse_huge_page(__alloc_pages(order 9, {})): {outcome}",
                        gfp.describe()
                    ));
                }
                v
            }
            CollapseStep::Return {
                last_fail, errno, ..
            } => vec![match (errno, last_fail) {
                (None, _) => "madvise_collapse returns 0: every range is PMD-mapped".into(),
                (Some(e), Some(r)) => format!(
                    "madvise_collapse returns {e} (madvise_collapse_errno({}))",
                    r.name()
                ),
                (Some(e), None) => format!("madvise_collapse returns {e}"),
            }],
        }
    }
}

/// hpage_collapse_scan_pmd's verdict with what it counted.
fn describe_scan(scan: Scan, counts: Option<&ScanCounts>) -> String {
    let mut s = String::from("hpage_collapse_scan_pmd: ");
    let Some(c) = counts else {
        // Decided by find_pmd_or_thp_or_none, before any PTE.
        let why = match scan {
            Scan::PmdNull => "no page table above the range",
            Scan::PmdNone => "no PTE table in the range (nothing mapped)",
            Scan::PmdMapped => "already mapped by a PMD",
            _ => "",
        };
        let _ = write!(s, "{why}: {}", scan.name());
        return s;
    };
    let _ = write!(
        s,
        "{} of 512 PTEs scanned: {} none or zero",
        c.ptes, c.none_or_zero
    );
    match (c.max_ptes_none, c.max_ptes_shared) {
        (Some(none), Some(shared)) => {
            let _ = write!(
                s,
                " (max_ptes_none {none}), {} shared (max_ptes_shared {shared})",
                c.shared
            );
        }
        _ => {
            let _ = write!(s, ", {} shared (MADV_COLLAPSE applies no limit)", c.shared);
        }
    }
    let why = match scan {
        Scan::ExceedNonePte => "; more none or zero PTEs than max_ptes_none: ",
        Scan::ExceedSharedPte => "; more shared PTEs than max_ptes_shared: ",
        Scan::PageCount => "; a page has references beyond its mappings (a pin): ",
        _ => ": ",
    };
    let _ = write!(s, "{why}{}", scan.name());
    s
}

/// Faults with the same chain of decisions, in the order first seen.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct FaultGroup {
    pub faults: u64,
    /// The first and last faulting address of the group.
    pub first: u64,
    pub last: u64,
    pub write: bool,
    pub steps: Vec<Step>,
}

/// Groups faults by their decision chain ("128 faults: ...").
pub fn group(faults: &[FaultTrace]) -> Vec<FaultGroup> {
    let mut groups: Vec<FaultGroup> = Vec::new();
    let mut index: std::collections::HashMap<(bool, &[Step]), usize> = Default::default();
    for f in faults {
        match index.get(&(f.write, f.steps.as_slice())) {
            Some(&i) => {
                let g = &mut groups[i];
                g.faults += 1;
                g.first = g.first.min(f.addr);
                g.last = g.last.max(f.addr);
            }
            None => {
                index.insert((f.write, f.steps.as_slice()), groups.len());
                groups.push(FaultGroup {
                    faults: 1,
                    first: f.addr,
                    last: f.addr,
                    write: f.write,
                    steps: f.steps.clone(),
                });
            }
        }
    }
    groups
}

/// The outcome of a scan or a collapse (`enum scan_result` of
/// mm/khugepaged.c, the cases the model meets), here beside the trace that
/// records it, as `include/trace/events/huge_memory.h` lists its names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Scan {
    Succeed,
    /// No PMD table above the range (mm_find_pmd found no PUD entry:
    /// SCAN_PMD_NULL).
    PmdNull,
    /// A PMD table, but no PTE table in this entry (pmd_none: SCAN_PMD_NONE).
    PmdNone,
    /// Already a PMD mapping (SCAN_PMD_MAPPED).
    PmdMapped,
    ExceedNonePte,
    ExceedSharedPte,
    /// A folio with references beyond its mappings, e.g. a GUP pin
    /// (SCAN_PAGE_COUNT).
    PageCount,
    /// No memory for the THP (SCAN_ALLOC_HUGE_PAGE_FAIL).
    AllocHugePageFail,
    /// The THP could not be charged to the mm's memcg
    /// (SCAN_CGROUP_CHARGE_FAIL).
    CgroupChargeFail,
}

impl Scan {
    /// The kernel's name: `SCAN_EXCEED_NONE_PTE`.
    pub fn name(self) -> &'static str {
        match self {
            Scan::Succeed => "SCAN_SUCCEED",
            Scan::PmdNull => "SCAN_PMD_NULL",
            Scan::PmdNone => "SCAN_PMD_NONE",
            Scan::PmdMapped => "SCAN_PMD_MAPPED",
            Scan::ExceedNonePte => "SCAN_EXCEED_NONE_PTE",
            Scan::ExceedSharedPte => "SCAN_EXCEED_SHARED_PTE",
            Scan::PageCount => "SCAN_PAGE_COUNT",
            Scan::AllocHugePageFail => "SCAN_ALLOC_HUGE_PAGE_FAIL",
            Scan::CgroupChargeFail => "SCAN_CGROUP_CHARGE_FAIL",
        }
    }
}
