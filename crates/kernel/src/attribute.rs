//! What of a noisy window is still the workload's own.
//!
//! A window is noisy when another process faulted in it or changed
//! anonymous memory or page tables (see [`crate::measure`]). On a busy
//! machine that is most windows, and the counters another process can move
//! would be unknown from the first of them on. Two rules keep some of them
//! known, each from the kernel's own readings, never from the model:
//!
//! - **The agents' own counts** ([`own_deltas`]). pgfault, NR_ANON_MAPPED
//!   and NR_PAGETABLE are counted system-wide and, for the same events, per
//!   process: the faults each agent took (`mm_account_fault` counts a fault
//!   in PGFAULT and in the task's min_flt/maj_flt; the agents add the
//!   failed ones, which only PGFAULT counts), its RssAnon (MM_ANONPAGES,
//!   moved with NR_ANON_MAPPED by the same rmap calls while no page is
//!   shared, i.e. before any fork) and its VmPTE (`mm->pgtables_bytes`,
//!   moved with NR_PAGETABLE by the same table allocations and frees, which
//!   the window waits for). In a clean window the two agree (checked:
//!   `own_changes`, and pgfault against the agents' faults), so in a noisy
//!   one the per-process change is the workload's.
//! - **A size no one else holds** ([`sizes_alone`]). The per-size gauges
//!   `mthp.<size>.nr_anon` and `nr_anon_partially_mapped` (and, for the PMD
//!   size, AnonHugePages) move only with anonymous folios of that size, and
//!   some events only with a partially unmapped one (`split_deferred`; for
//!   the PMD size thp_deferred_split_page and the under-used shrinker's
//!   split). When, as the window opens, the machine holds exactly as many
//!   of them as the workload's windows made (so no other process holds
//!   one) and nothing that makes one (a fault's or swap-in's allocation,
//!   khugepaged's collapse) moved in the window or in the one before (a
//!   fault counts its allocation before its pgfault), another process had
//!   none to free, split or map: those counters' change is the workload's.
//!   Anonymous folios split only to order 0 in Linux 6.18 (`split_folio`
//!   from deferred_split_scan, reclaim, migration and madvise), so another
//!   process's split of a larger folio makes none of a smaller size.
//!
//! - **A range's new folios** ([`Touched`]). A `read` or `write` of a
//!   range of private anonymous memory (not a file, shared or
//!   HugeTLB mapping, whose folios these counters do not count), by a
//!   process outside the workload's memory cgroups (a charge there may
//!   reclaim elsewhere), with nothing swapped out in it (and, after a fork,
//!   nothing mapped), allocates exactly
//!   the folios it maps there beyond those mapped before (pagemap and
//!   kpageflags, read before the window and after it; a range with nothing
//!   mapped, found by one PAGEMAP_SCAN call, is not read before; one above
//!   64 MiB with something mapped is not attributed). A fault allocates
//!   only where every entry of its block is none, never unmaps, and a read
//!   fault maps the zero page: of each mTHP size, `anon_fault_alloc` and
//!   `nr_anon` change by the new folios and `nr_anon_partially_mapped` not
//!   at all; the new PMD-mapped ones are thp_fault_alloc and
//!   nr_anon_transparent_hugepages. Not when kpageflags reads 0 for one of
//!   the range's pages, or an order-9 folio is mapped by PTEs.
//!
//! - **A statement that leaves the folios alone** ([`leaves_folios`]): a
//!   `set` of a THP knob or a HugeTLB pool, an mmap without MAP_POPULATE,
//!   MADV_HUGEPAGE or NOHUGEPAGE, `thp_disable`, when the agents took no
//!   fault of the workload's in it, and a `fork` while nothing was ever
//!   pinned, change no THP counter of the workload's: every `mthp.*` and
//!   `vmstat.thp_*` change of the window is another's (or khugepaged's,
//!   which is judged apart), the workload's is 0.
//!
//! - **A window without a fault of the agents'** ([`faultless`]): the
//!   page-fault path's allocation and fallback counters count the faulting
//!   task's faults only, so with none of the agents' the workload's change
//!   of each is 0 (not a `fork`'s window, whose child faults on its own
//!   memory; not one in which an agent was killed).
//!
//! What stays unknown: the event counters another process moved in the
//! window (no per-process count of them exists), the anonymous-memory
//! gauges after a fork (pages shared between agents count once in the
//! machine, in each agent's RssAnon), a window in which an agent was
//! killed, exited or took faults of its own (its own memory moved), and a
//! size whose folios another process holds.

use crate::pagemap::{self, FolioScan};
use hugelab_workload::units::{HPAGE_PMD_ORDER, PAGE_KB, PMD_SIZE};
use hugelab_workload::{Counters, StmtKind};
use std::collections::{BTreeMap, BTreeSet};

/// The agents' own faults, anonymous memory and page tables before and
/// after a window, and whether the per-process counts stand for the
/// workload's there (see [`own_deltas`]).
pub(crate) struct OwnChange {
    /// The faults the agents took in the window, failed ones included,
    /// less those outside the workload's accesses.
    pub(crate) faults: Option<i64>,
    /// The change of the agents' RssAnon, kB, when it is the workload's
    /// NR_ANON_MAPPED change (no fork so far, the same agents, none of
    /// their own faults).
    pub(crate) anon_kb: Option<i64>,
    /// The change of the agents' VmPTE, kB, when it is the workload's
    /// NR_PAGETABLE change (not a fork, the same agents).
    pub(crate) pte_kb: Option<i64>,
}

/// The workload's change of each counter the agents' own counts stand for
/// in a noisy window, with the system-wide name.
pub(crate) fn own_deltas(own: &OwnChange) -> Vec<(&'static str, i64)> {
    let page_kb = PAGE_KB as i64;
    let mut out = Vec::new();
    if let Some(f) = own.faults {
        out.push(("vmstat.pgfault", f));
    }
    if let Some(kb) = own.anon_kb {
        out.push(("vmstat.nr_anon_pages", kb / page_kb));
        out.push(("meminfo.AnonPages", kb));
    }
    if let Some(kb) = own.pte_kb {
        out.push(("vmstat.nr_page_table_pages", kb / page_kb));
        out.push(("meminfo.PageTables", kb));
    }
    out
}

/// A `read` or `write` of `[start, end)` of process `pid`, with nothing
/// swapped out in it and no fork so far (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct Touched {
    pub(crate) pid: i32,
    pub(crate) start: u64,
    pub(crate) end: u64,
    /// Its folios before the statement; None: nothing was mapped in it.
    pub(crate) before: Option<FolioScan>,
}

/// The largest range whose folios are read before a `read` or `write`
/// that finds something mapped in it: the scan (pagemap and kpageflags,
/// outside the window) costs time in proportion.
const SCAN_BEFORE_MAX: u64 = 64 << 20;

impl Touched {
    /// What a `read` or `write` of `[start, end)` of `pid` needs to know
    /// beforehand, when its allocations can be told afterwards: after a
    /// fork only in a range with nothing mapped (a write may copy a shared
    /// folio, which then leaves the range), never with a page swapped out
    /// (a swap-in is no fault allocation).
    pub(crate) fn before(pid: i32, start: u64, end: u64, forked: bool) -> Option<Touched> {
        let before = if pagemap::anything_in(pid, start, end).ok()? {
            // After a fork, only a range with nothing mapped: no folio in
            // it can be shared.
            if forked
                || end - start > SCAN_BEFORE_MAX
                || pagemap::swapped_in(pid, start, end).ok()?
            {
                return None;
            }
            Some(pagemap::scan_folios(pid, start, end).ok()?)
        } else {
            None
        };
        Some(Touched {
            pid,
            start,
            end,
            before,
        })
    }
}

/// The workload's change of each allocation counter and per-size gauge in
/// the window of a [`Touched`] range, from its folios now (`sizes_kb`: the
/// mTHP sizes the machine has); None when they cannot all be told.
pub(crate) fn touched_deltas(t: &Touched, sizes_kb: &[u64]) -> Option<Vec<(String, i64)>> {
    let after = pagemap::scan_folios(t.pid, t.start, t.end).ok()?;
    let empty = FolioScan::default();
    let before = t.before.as_ref().unwrap_or(&empty);
    let pmd_order = HPAGE_PMD_ORDER as usize;
    for s in [before, &after] {
        if s.unknown_pages != 0 || s.total[pmd_order] != s.pmd_mapped {
            return None;
        }
    }
    // A fault only adds folios: fewer of a size is something else.
    let made = |order: usize| -> Option<i64> {
        let n = after
            .total
            .get(order)?
            .checked_sub(*before.total.get(order)?)?;
        Some(n as i64)
    };
    let mut out = Vec::new();
    for &kb in sizes_kb {
        let n = made((kb / PAGE_KB).trailing_zeros() as usize)?;
        out.push((format!("mthp.{kb}kB.anon_fault_alloc"), n));
        out.push((format!("mthp.{kb}kB.nr_anon"), n));
        out.push((format!("mthp.{kb}kB.nr_anon_partially_mapped"), 0));
    }
    let pmd = after.pmd_mapped.checked_sub(before.pmd_mapped)? as i64;
    out.push(("vmstat.thp_fault_alloc".into(), pmd));
    out.push(("vmstat.nr_anon_transparent_hugepages".into(), pmd));
    Some(out)
}

/// Whether a statement that took no fault leaves every folio of the
/// workload as it was (see the module doc).
pub(crate) fn leaves_folios(kind: &StmtKind, pinned: bool) -> bool {
    use hugelab_workload::Advice;
    match kind {
        // THP modes, and HugeTLB pools (they take free pages; a workload
        // that does not fit is refused before it starts).
        StmtKind::Set(s) => {
            let path = s.tunable.path();
            path.starts_with("transparent_hugepage/")
                || path.starts_with("hugepages/")
                || matches!(
                    path.as_str(),
                    "vm.nr_hugepages"
                        | "vm.nr_overcommit_hugepages"
                        | "vm.hugetlb_optimize_vmemmap"
                        | "vm.overcommit_memory"
                )
        }
        // copy_page_range shares every anonymous folio, PMD-mapped ones
        // whole (copy_huge_pmd), unless one may be pinned: then it copies
        // it, or splits its PMD.
        StmtKind::Fork(_) => !pinned,
        StmtKind::Mmap(m) => !m.populate,
        StmtKind::Madvise(m) => matches!(m.advice, Advice::Hugepage | Advice::NoHugepage),
        StmtKind::ThpDisable(_) => true,
        _ => false,
    }
}

/// The THP counters of a window whose statement [`leaves_folios`]: the
/// workload's change of each is 0 (page-cache and shmem THPs are not the
/// agents').
pub(crate) fn untouched(names: impl IntoIterator<Item = String>) -> Vec<(String, i64)> {
    names
        .into_iter()
        .filter(|n| {
            let mthp = n.starts_with("mthp.") && !n.contains(".shmem_");
            let thp = n.starts_with("vmstat.thp_") && !n.starts_with("vmstat.thp_file_");
            mthp || thp || n == "vmstat.nr_anon_transparent_hugepages"
        })
        .map(|n| (n, 0))
        .collect()
}

/// The events counted only on the page-fault path, for the task that
/// faults (Linux 6.18: `alloc_anon_folio` and `vma_alloc_anon_folio_pmd`
/// count an anonymous fault's allocation, its fallback and its charge's
/// fallback, per size and for the PMD size in vmstat): in a window in which
/// no agent took a fault (a fault of GUP's, for MADV_POPULATE or a pin,
/// counts in the task's min_flt too), the workload's change of each is 0.
pub(crate) fn faultless(names: impl IntoIterator<Item = String>) -> Vec<(String, i64)> {
    const PER_SIZE: [&str; 3] = [
        ".anon_fault_alloc",
        ".anon_fault_fallback",
        ".anon_fault_fallback_charge",
    ];
    const VMSTAT: [&str; 3] = [
        "vmstat.thp_fault_alloc",
        "vmstat.thp_fault_fallback",
        "vmstat.thp_fault_fallback_charge",
    ];
    names
        .into_iter()
        .filter(|n| {
            let per_size = n.starts_with("mthp.") && PER_SIZE.iter().any(|e| n.ends_with(e));
            per_size || VMSTAT.contains(&n.as_str())
        })
        .map(|n| (n, 0))
        .collect()
}

/// The rules' workload changes, one per counter: two rules may speak of
/// the same counter (a write that faulted nowhere is both a range's new
/// folios, none, and a window without a fault), and its replacement must be
/// made once. Where they disagree neither is taken: the counter stays as
/// the window's noise left it.
pub(crate) fn agreed(deltas: Vec<(String, i64)>) -> BTreeMap<String, i64> {
    let mut agreed = BTreeMap::new();
    let mut disputed = BTreeSet::new();
    for (name, delta) in deltas {
        match agreed.get(&name) {
            Some(d) if *d != delta => {
                disputed.insert(name);
            }
            _ => {
                agreed.insert(name, delta);
            }
        }
    }
    agreed.retain(|name, _| !disputed.contains(name));
    agreed
}

/// The gauges of mTHP size `kb`: what only anonymous folios of that size
/// move.
fn size_gauges(kb: u64) -> Vec<String> {
    let mut g = vec![
        format!("mthp.{kb}kB.nr_anon"),
        format!("mthp.{kb}kB.nr_anon_partially_mapped"),
    ];
    if kb == PMD_SIZE >> 10 {
        // NR_ANON_THPS: PMD-mapped anonymous folios of the PMD size.
        g.push("meminfo.AnonHugePages".into());
        g.push("vmstat.nr_anon_transparent_hugepages".into());
    }
    g
}

/// The counters whose change makes an anonymous folio of size `kb`:
/// a fault's or a swap-in's allocation, and for the PMD size khugepaged's
/// and MADV_COLLAPSE's. (Splits of anonymous folios make order-0 pages
/// only; migration needs a folio of the size already.)
fn makes_size(name: &str, kb: u64) -> bool {
    let of_size = |item: &str| name == format!("mthp.{kb}kB.{item}");
    of_size("anon_fault_alloc")
        || of_size("swpin")
        || (kb == PMD_SIZE >> 10
            && matches!(
                name,
                "vmstat.thp_fault_alloc"
                    | "vmstat.thp_collapse_alloc"
                    | "khugepaged.pages_collapsed"
            ))
}

/// The event counters that only the holder of an anonymous folio of size
/// `kb` moves: `deferred_split_folio` (a partially unmapped anonymous
/// folio) and, for the PMD size, the under-used shrinker's split. (The
/// `split` counters also count page-cache folios, and thp_split_pmd file
/// THPs and the huge zero page, which anyone may hold.)
fn held_events(kb: u64) -> Vec<String> {
    let mut e = vec![format!("mthp.{kb}kB.split_deferred")];
    if kb == PMD_SIZE >> 10 {
        e.push("vmstat.thp_deferred_split_page".into());
        e.push("vmstat.thp_underused_split_page".into());
    }
    e
}

/// The per-size gauges and held events whose change in a noisy window
/// (read `before` and `after` it) is the workload's alone (see the module
/// doc): for each mTHP size, the machine's `nr_anon` as the window opened
/// equals the workload's (`totals`, the windows' sums with this one's,
/// none of the size's gauges `tainted`), and no counter that makes a folio
/// of the size moved in the window or in `moved_last` (the window before's
/// moved events).
pub(crate) fn sizes_alone(
    sizes_kb: impl IntoIterator<Item = u64>,
    (before, after): (&Counters, &Counters),
    totals: &Counters,
    tainted: &dyn Fn(&str) -> bool,
    moved_last: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    for kb in sizes_kb {
        let nr_anon = format!("mthp.{kb}kB.nr_anon");
        let gauges = size_gauges(kb);
        if gauges.iter().any(|g| tainted(g) || !after.contains_key(g)) {
            continue;
        }
        let (Some(b), Some(a)) = (before.get(&nr_anon), after.get(&nr_anon)) else {
            continue;
        };
        // The windows' sum before this window's change was added.
        let workload = totals.get(&nr_anon).copied().unwrap_or(0) - (a - b);
        if *b != workload {
            continue;
        }
        let made_here = after
            .iter()
            .any(|(n, v)| before.get(n) != Some(v) && makes_size(n, kb));
        let made_before = moved_last.iter().any(|n| makes_size(n, kb));
        if !made_here && !made_before {
            out.extend(gauges);
            out.extend(held_events(kb).into_iter().filter(|e| !tainted(e)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(pairs: &[(&str, i64)]) -> Counters {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// A write that faulted nowhere: the touched rule and the faultless
    /// one both say 0 new 64K folios; the replacement is made once. A
    /// dispute leaves the counter to the noise.
    #[test]
    fn two_rules_on_one_counter_count_once_and_a_dispute_counts_none() {
        let d = |n: &str, v| (n.to_string(), v);
        let a = agreed(vec![
            d("mthp.64kB.anon_fault_alloc", 0),
            d("vmstat.pgfault", 0),
            d("mthp.64kB.anon_fault_alloc", 0),
            d("mthp.16kB.anon_fault_alloc", 1),
            d("mthp.16kB.anon_fault_alloc", 0),
        ]);
        let want: BTreeMap<String, i64> =
            [d("mthp.64kB.anon_fault_alloc", 0), d("vmstat.pgfault", 0)]
                .into_iter()
                .collect();
        assert_eq!(a, want);
    }

    fn alone(
        before: &Counters,
        after: &Counters,
        totals: &Counters,
        moved_last: &[String],
    ) -> Vec<String> {
        sizes_alone([64, 2048], (before, after), totals, &|_| false, moved_last)
    }

    fn reading(n64: i64, alloc64: i64, n2m: i64, thp: i64) -> Counters {
        c(&[
            ("mthp.64kB.nr_anon", n64),
            ("mthp.64kB.nr_anon_partially_mapped", 0),
            ("mthp.64kB.anon_fault_alloc", alloc64),
            ("mthp.2048kB.nr_anon", n2m),
            ("mthp.2048kB.nr_anon_partially_mapped", 0),
            ("meminfo.AnonHugePages", n2m * 2048),
            ("vmstat.nr_anon_transparent_hugepages", n2m),
            ("vmstat.thp_fault_alloc", thp),
        ])
    }

    #[test]
    fn a_size_no_one_else_holds_stays_the_workload_s() {
        // The workload made 3 64K folios in earlier windows and frees one
        // in this one; the machine held exactly those 3.
        let (before, after) = (reading(3, 10, 0, 0), reading(2, 10, 0, 0));
        let totals = c(&[("mthp.64kB.nr_anon", 2), ("mthp.2048kB.nr_anon", 0)]);
        let got = alone(&before, &after, &totals, &[]);
        assert!(got.contains(&"mthp.64kB.nr_anon".to_string()));
        assert!(got.contains(&"meminfo.AnonHugePages".to_string()));
    }

    #[test]
    fn a_size_another_process_holds_is_not() {
        // The machine holds 5 64K folios, the workload made 3: two are
        // another's, which it may free in this window.
        let (before, after) = (reading(5, 10, 0, 0), reading(4, 10, 0, 0));
        let totals = c(&[("mthp.64kB.nr_anon", 2)]);
        let got = alone(&before, &after, &totals, &[]);
        assert!(!got.iter().any(|g| g.starts_with("mthp.64kB")));
        assert!(got.contains(&"mthp.2048kB.nr_anon".to_string()));
    }

    #[test]
    fn an_allocation_of_the_size_in_the_window_or_the_one_before_is_anyone_s() {
        let (before, after) = (reading(0, 10, 0, 4), reading(1, 11, 1, 5));
        let totals = c(&[("mthp.64kB.nr_anon", 1), ("mthp.2048kB.nr_anon", 1)]);
        assert!(alone(&before, &after, &totals, &[]).is_empty());
        let (before, after) = (reading(0, 10, 0, 4), reading(0, 10, 0, 4));
        let totals = c(&[("mthp.64kB.nr_anon", 0), ("mthp.2048kB.nr_anon", 0)]);
        let last = ["vmstat.thp_fault_alloc".to_string()];
        let got = alone(&before, &after, &totals, &last);
        assert!(got.iter().all(|g| g.starts_with("mthp.64kB")), "{got:?}");
    }

    #[test]
    fn a_deferred_split_is_the_holder_s() {
        let mut before = reading(4, 10, 0, 0);
        before.insert("mthp.64kB.split_deferred".into(), 1);
        let mut after = reading(4, 10, 0, 0);
        after.insert("mthp.64kB.nr_anon_partially_mapped".into(), 1);
        after.insert("mthp.64kB.split_deferred".into(), 2);
        let totals = c(&[("mthp.64kB.nr_anon", 4)]);
        let got = alone(&before, &after, &totals, &[]);
        assert!(got.contains(&"mthp.64kB.split_deferred".to_string()));
        // Another process holds one 64K folio: its split may be this one.
        let totals = c(&[("mthp.64kB.nr_anon", 3)]);
        let got = alone(&before, &after, &totals, &[]);
        assert!(!got.contains(&"mthp.64kB.split_deferred".to_string()));
    }

    #[test]
    fn the_agents_own_counts_name_the_system_counters() {
        let own = OwnChange {
            faults: Some(7),
            anon_kb: Some(-64),
            pte_kb: None,
        };
        assert_eq!(
            own_deltas(&own),
            vec![
                ("vmstat.pgfault", 7),
                ("vmstat.nr_anon_pages", -16),
                ("meminfo.AnonPages", -64)
            ]
        );
    }

    #[test]
    fn without_a_fault_the_fault_paths_counters_are_none_of_the_workloads() {
        let names = [
            "mthp.64kB.anon_fault_alloc",
            "mthp.64kB.anon_fault_fallback_charge",
            "mthp.64kB.split",
            "mthp.64kB.shmem_fallback",
            "vmstat.thp_fault_alloc",
            "vmstat.thp_fault_fallback",
            "vmstat.thp_collapse_alloc",
            "vmstat.thp_split_pmd",
            "vmstat.pgfault",
        ];
        let got: Vec<String> = faultless(names.iter().map(|n| n.to_string()))
            .into_iter()
            .map(|(n, d)| {
                assert_eq!(d, 0);
                n
            })
            .collect();
        assert_eq!(
            got,
            [
                "mthp.64kB.anon_fault_alloc",
                "mthp.64kB.anon_fault_fallback_charge",
                "vmstat.thp_fault_alloc",
                "vmstat.thp_fault_fallback"
            ]
        );
    }
}
