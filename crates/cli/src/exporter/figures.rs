//! What one pass of the exporter's content scan found, per memory cgroup,
//! and what the pass cost.
//!
//! Each process is scanned by the kernel crate's scan (`hugelab scan`'s),
//! its utilization report computed, and only the sums are kept: memory is
//! bounded by the number of cgroups (at the exporter's depth), not by the
//! processes or their pages. The price, stated in the metrics' help: a THP
//! that two processes map (after fork) counts once per process, where
//! `hugelab scan --rollup` unites the views by PFN and counts it once.

use hugelab_kernel::scan::ProcessScan;
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::utilization::{
    utilization_report, Bucket, GiveBack, ShrinkerSettings, DEFAULT_BUCKETS,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

/// `khugepaged/max_ptes_none` the under-used shrinker's authors recommend
/// turning it on with.
pub const RECOMMENDED_MAX_PTES_NONE: u32 = 409;

/// The two settings a give-back is predicted at: the machine's, and the
/// recommended ones (shrink_underused on, max_ptes_none 409).
#[derive(Clone, Copy, Debug)]
pub struct Predictions {
    pub machine: ShrinkerSettings,
    pub recommended: ShrinkerSettings,
}

impl Predictions {
    pub fn new(machine: ShrinkerSettings) -> Predictions {
        Predictions {
            machine,
            recommended: ShrinkerSettings {
                max_ptes_none: RECOMMENDED_MAX_PTES_NONE,
                shrink_underused: true,
            },
        }
    }
}

/// The sums over the processes of one cgroup.
#[derive(Clone, Debug, Default)]
pub struct CgroupFigures {
    pub processes: u64,
    /// smaps `Anonymous` and `AnonHugePages`, summed, kB.
    pub anon_kb: u64,
    pub anon_huge_kb: u64,
    /// Anonymous memory mapped from large folios, by folio size (kB), kB.
    pub large_kb: BTreeMap<u64, u64>,
    /// Present PTE-mapped memory whose kpageflags read 0, kB.
    pub unclassified_kb: u64,
    /// The seed-004 histogram of the fully mapped large folios, by folio
    /// size (kB): folios and zero-filled subpages per bucket of subpages in
    /// use.
    pub histogram: BTreeMap<u64, Vec<Bucket>>,
    /// What the deferred split shrinker would give back at the machine's
    /// settings and at the recommended ones.
    pub machine: GiveBack,
    pub recommended: GiveBack,
}

impl CgroupFigures {
    /// Adds one scanned process.
    pub fn add(&mut self, scan: &ProcessScan, at: &Predictions) {
        self.processes += 1;
        for v in &scan.vmas {
            self.anon_kb += v.vma.anonymous_kb;
            self.anon_huge_kb += v.vma.anon_huge_kb;
            self.unclassified_kb += v.unclassified_kb;
        }
        for f in &scan.folios {
            *self.large_kb.entry(PAGE_KB << f.order).or_default() += u64::from(f.mapped) * PAGE_KB;
        }
        let machine = utilization_report(&scan.folios, at.machine, DEFAULT_BUCKETS);
        for s in &machine.sizes {
            let sum = self
                .histogram
                .entry(s.size_kb)
                .or_insert_with(|| s.buckets.iter().map(empty).collect());
            for (into, b) in sum.iter_mut().zip(&s.buckets) {
                into.folios += b.folios;
                into.zero_pages += b.zero_pages;
            }
        }
        add_give_back(&mut self.machine, &machine.give_back);
        let recommended = utilization_report(&scan.folios, at.recommended, DEFAULT_BUCKETS);
        add_give_back(&mut self.recommended, &recommended.give_back);
    }
}

fn empty(b: &Bucket) -> Bucket {
    Bucket {
        folios: 0,
        zero_pages: 0,
        ..b.clone()
    }
}

fn add_give_back(into: &mut GiveBack, g: &GiveBack) {
    into.underused_folios += g.underused_folios;
    into.underused_kb += g.underused_kb;
    into.partial_folios += g.partial_folios;
    into.partial_kb += g.partial_kb;
    into.partial_unmapped_kb += g.partial_unmapped_kb;
    into.rss_kb += g.rss_kb;
}

/// Why a process was not scanned.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    /// It exited before or during its scan.
    Exited,
    /// The kernel refused to let us read it.
    Denied,
    /// Any other error of its scan (named on stderr once per pass).
    Error,
}

impl Skip {
    pub const ALL: [Skip; 3] = [Skip::Exited, Skip::Denied, Skip::Error];

    pub fn name(self) -> &'static str {
        match self {
            Skip::Exited => "exited",
            Skip::Denied => "denied",
            Skip::Error => "error",
        }
    }
}

/// What a pass cost.
#[derive(Clone, Debug, Default)]
pub struct Cost {
    /// From its start to its end, waits for the budget included.
    pub wall: Duration,
    /// The exporter's CPU time in that while (every thread).
    pub cpu: Duration,
    /// The time it waited to keep within the CPU budget.
    pub waited: Duration,
    /// Pages of anon large folios whose content was read.
    pub pages_read: u64,
    /// Processes scanned (kernel threads, which have no memory, are not).
    pub scanned: u64,
    pub skipped: BTreeMap<Skip, u64>,
}

/// One complete pass.
#[derive(Clone, Debug)]
pub struct Pass {
    pub finished: SystemTime,
    pub finished_at: Instant,
    pub predictions: Predictions,
    /// By cgroup path at the exporter's depth (`/` the root).
    pub cgroups: BTreeMap<String, CgroupFigures>,
    pub cost: Cost,
}

/// The cgroup `path` (relative to the hierarchy's root, as
/// /proc/PID/cgroup gives it) counts in: itself, or its ancestor `depth`
/// levels below the root.
pub fn at_depth(path: &str, depth: usize) -> String {
    let parts: Vec<&str> = path
        .split('/')
        .filter(|p| !p.is_empty())
        .take(depth)
        .collect();
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_workload::utilization::{set_subpage, subpage_words, FolioUse};

    #[test]
    fn cgroups_deeper_than_the_depth_count_in_their_ancestor() {
        assert_eq!(at_depth("", 2), "/");
        assert_eq!(at_depth("system.slice", 2), "/system.slice");
        assert_eq!(at_depth("/a/b/c", 2), "/a/b");
        assert_eq!(at_depth("a/b/c", 0), "/");
    }

    /// A fully mapped PMD THP of `pfn` with `zero` zero-filled subpages.
    fn thp(pfn: u64, zero: u32) -> FolioUse {
        let mut f = FolioUse {
            order: 9,
            pmd_mapped: true,
            pfn: Some(hugelab_workload::units::Pfn(pfn)),
            mapped_bits: vec![!0; subpage_words(9)],
            zero_bits: vec![0; subpage_words(9)],
            ..FolioUse::default()
        };
        for i in 0..zero as usize {
            set_subpage(&mut f.zero_bits, i);
        }
        f.mapped = 512;
        f.zero = zero;
        f.zero_mappings = zero;
        f
    }

    /// Two processes of one cgroup: the histogram and the give-back are
    /// their sums; 409 splits what the machine's 511 never does.
    #[test]
    fn processes_of_a_cgroup_add_up() {
        let scan = |pid, folios| ProcessScan {
            pid,
            comm: "t".into(),
            vmas: Vec::new(),
            folios,
            folio_pages: 0,
        };
        let at = Predictions::new(ShrinkerSettings {
            max_ptes_none: 511,
            shrink_underused: true,
        });
        let mut cg = CgroupFigures::default();
        cg.add(&scan(1, vec![thp(512, 508), thp(1024, 0)]), &at);
        cg.add(&scan(2, vec![thp(2048, 410)]), &at);
        assert_eq!(cg.processes, 2);
        assert_eq!(cg.large_kb[&2048], 3 * 2048);
        let h = &cg.histogram[&2048];
        // Used subpages 4, 512 and 102: buckets 0-50, 460-512 and 102-152.
        assert_eq!(h.len(), 10);
        assert_eq!((h[0].folios, h[0].zero_pages), (1, 508));
        assert_eq!((h[9].folios, h[9].zero_pages), (1, 0));
        assert_eq!((h[2].lo, h[2].folios, h[2].zero_pages), (102, 1, 410));
        // max_ptes_none 511 turns the under-used split off.
        assert_eq!(cg.machine.freed_kb(), 0);
        // At 409: 508 and 410 zero-filled subpages are more than 409.
        assert_eq!(cg.recommended.underused_folios, 2);
        assert_eq!(cg.recommended.freed_kb(), (508 + 410) * PAGE_KB);
    }
}
