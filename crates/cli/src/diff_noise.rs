//! Which of the kernel backend's `unknown` reasons are *noise*: activity
//! that is not the workload's inside a measuring window (another process's
//! faults, anonymous memory, page tables or folios; khugepaged collapsing on
//! its own), which a re-run of the same workload, a
//! deterministic thing, may well not meet. Every other reason is *by
//! construction*: every run of the workload has it (a `fork` copies the
//! agent's own memory, HVO splits vmemmap PMDs, kpageflags reads 0, a
//! process was killed, khugepaged passes with a `pages_to_scan` that is not
//! a multiple of 512), so re-running would only cost time.
//!
//! Between the two lies *placement* ([`depends_on_placement`]): which
//! physical pages a run's folios get is the machine's choice, and on these
//! VMs /proc/kpageflags reads 0 for whole 2 MiB blocks of them, so a
//! region's folios are unknown in one run and known in the next. It is no
//! other process's doing (not noise), but a re-run may well not meet it.
//!
//! This is the one place that tells them apart: `diff` re-runs a workload
//! for noise and placement only (`--retries`), and counts what stays noisy
//! apart from what is unknown by construction (placement included). The kernel backend's reasons are
//! sentences (crates/kernel/src/measure.rs and khugepaged.rs); those of
//! foreign activity start with one of [`NOISE`] or say one of
//! [`NOISE_SAYS`], and a new reason of that kind must be listed there.

/// How the reasons of foreign activity start (compared without case).
const NOISE: &[&str] = &[
    // "another process faulted during line N ...", "another process
    // changed anonymous memory ...", "another process's page tables
    // changed ...", "another process's folios changed mthp.* ..."
    "another process",
    // "khugepaged collapsed memory on its own before line N",
    // "khugepaged collapsed memory during line N" (outside a `khugepaged`
    // statement or MADV_COLLAPSE)
    "khugepaged collapsed memory",
];

/// What the other reasons of foreign activity say (compared without
/// case): "pgdeactivate +1 during line N, a `munmap`, which moves no folio
/// between the LRU lists: kswapd's or another process's" says the first;
/// the kernel backend's count of the workload's folios contradicting a
/// trusted sum ("the windows' sum is 3, but the workload's mappings hold
/// 2: another process's folios moved it unseen ...", crates/kernel's
/// census) says the second.
const NOISE_SAYS: &[&str] = &[
    "kswapd's or another process's",
    "another process's folios moved it unseen",
];

/// How the reasons that depend on where a run's folios were placed start.
const PLACEMENT: &[&str] = &["/proc/kpageflags read 0"];

/// Whether an `unknown` reason is one a re-run may not meet although it is
/// no other process's doing (see the module doc).
pub(crate) fn depends_on_placement(why: &str) -> bool {
    let why = why.trim_start();
    PLACEMENT.iter().any(|start| why.starts_with(start))
}

/// Whether an `unknown` reason is noise (see the module doc).
pub(crate) fn is_noise(why: &str) -> bool {
    let why = why.trim_start().to_lowercase();
    NOISE.iter().any(|start| why.starts_with(start))
        || NOISE_SAYS.iter().any(|says| why.contains(says))
}

#[cfg(test)]
mod tests {
    use super::{depends_on_placement, is_noise};

    #[test]
    fn foreign_activity_is_noise_and_the_workloads_own_reasons_are_not() {
        // The kernel backend's reasons as it writes them.
        let noise = [
            "another process faulted during line 4 (pgfault +9; the agents' own +1, the runner's +0)",
            "another process changed anonymous memory during line 7 (nr_anon_pages +3, the workload's own +0)",
            "another process's page tables changed during line 7 (nr_page_table_pages -1, the workload's own +0)",
            "another process's folios changed mthp.64kB.anon_fault_alloc during line 3, a size this workload never enabled",
            "another process's memory left no free 2048kB block during line 5 (vmstat.thp_fault_fallback +2 beyond failed charges): the agents' faults may have fallen back where the model's machine has free blocks",
            "khugepaged collapsed memory on its own before line 12",
            "khugepaged collapsed memory during line 12",
            "pgdeactivate +1 during line 6, a `munmap`, which moves no folio between the LRU lists: kswapd's or another process's",
            "the windows' sum is 0, but the workload's mappings hold 1: another process's folios moved it unseen (freed or split without a fault of its own)",
        ];
        let by_construction = [
            "fork (line 5) copied the agent's own memory and page tables too",
            "a was killed at line 9: the agent's own memory and page tables went with its regions",
            "HVO is on from line 2: optimizing a HugeTLB page in a 128 MiB range ...",
            "/proc/kpageflags read 0 for 3 pages of a's region r, so their folios are not known",
            "khugepaged passed with pages_to_scan 100, not a multiple of 512: ...",
            "the memcg OOM killer killed a at line 3: ...",
            // Reasons that start with a process's name stay its own.
            "another was killed at line 9: the agent's own memory and page tables went with its regions",
            "khugepaged was killed at line 9: the agent's own memory and page tables went with its regions",
        ];
        for why in noise {
            assert!(is_noise(why), "{why}");
        }
        for why in by_construction {
            assert!(!is_noise(why), "{why}");
        }
        let placement = by_construction
            .iter()
            .filter(|why| depends_on_placement(why))
            .collect::<Vec<_>>();
        assert_eq!(
            placement,
            [&"/proc/kpageflags read 0 for 3 pages of a's region r, so their folios are not known"]
        );
        assert!(noise.iter().all(|why| !depends_on_placement(why)));
    }
}
