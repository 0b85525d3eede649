//! The workload's anonymous large folios, counted in its own mappings.
//!
//! Three system-wide gauges count anonymous large folios (Linux 6.18):
//! `mthp.<size>.nr_anon` (MTHP_STAT_NR_ANON: up when a folio of that order
//! becomes anonymous, `folio_add_new_anon_rmap`; down when it is freed,
//! `__free_pages_prepare`, or split, `__split_unmapped_folio`), and
//! NR_ANON_THPS (`vmstat.nr_anon_transparent_hugepages`, `meminfo.AnonHugePages`:
//! a PMD-order folio while a huge PMD maps it, `__folio_add_anon_rmap` and
//! `__folio_remove_rmap` at RMAP_LEVEL_PMD). An anonymous folio lives while
//! something maps it, so at a reading the workload's share of each is what
//! its agents' private anonymous regions map, each folio once however many
//! processes share it after a fork (pagemap and kpageflags: the head PFN,
//! the order, a huge PMD).
//!
//! `mthp.<size>.nr_anon_partially_mapped` (MTHP_STAT_NR_ANON_PARTIALLY_MAPPED)
//! counts the folios flagged partially mapped: `__folio_remove_rmap`
//! (CONFIG_PAGE_MAPCOUNT, as on these kernels) flags a large anonymous
//! folio when a PTE unmap leaves some of its pages mapped nowhere while
//! others still are, and the flag goes only with a split or the folio. A
//! large anonymous folio is mapped whole when it is made (a fault, a
//! collapse, a PMD split remaps every page) and a page once mapped nowhere
//! never comes back to it, so a folio is flagged exactly when some of its
//! pages are mapped nowhere: the union of its pages over every agent.
//!
//! NR_ANON_MAPPED (`vmstat.nr_anon_pages`, `meminfo.AnonPages`) counts each
//! anonymous page while something maps it (CONFIG_PAGE_MAPCOUNT), so it is
//! the pages of the same union, small folios' included; not when a private
//! file mapping is among the regions (its written pages are anonymous and
//! not told from the file's here).
//!
//! When no agent is alive, the workload has no page tables either
//! (NR_PAGETABLE: `free_pgtables` at each agent's exit).
//!
//! That count is the workload's where the windows' sums cannot be: after
//! another process moved the gauge unseen in a noisy window, or after a
//! fork or a kill moved the agents' own memory too. [`Census`] stands only
//! when every folio the workload holds is mapped where the scan looks:
//! - no page of a region swapped out or under migration (a folio in the
//!   swap cache or being migrated lives unmapped);
//! - nothing ever pinned (a pinned folio outlives its unmapping);
//! - kpageflags read every mapped page (0 means unknown, see
//!   [`crate::pagemap`]).
//!
//! And it is checked: where the windows' sum is trusted and the count
//! differs, the reading says so and the counter is unknown (see
//! `Measurement::judge`).

use crate::agents::Agents;
use crate::pagemap::{self, FolioScan, PageBits};
use hugelab_workload::units::{HPAGE_PMD_ORDER, PAGE_KB};
use std::collections::{HashMap, HashSet};

/// The most memory of private anonymous regions a reading counts the
/// folios of: the scan costs time in proportion (about 15 ms per GiB of
/// small folios, see crate::pagemap), at every reading.
const CENSUS_MAX: u64 = 1 << 30;

/// The anonymous large folios of the workload's regions at one reading.
#[derive(Default)]
pub(crate) struct Census {
    /// Head PFN → order, whether a huge PMD maps it, which pages are mapped.
    folios: HashMap<u64, (u8, bool, PageBits)>,
    /// The order-0 folios.
    small: HashSet<u64>,
    /// Why the anonymous pages mapped are not all the workload's anonymous
    /// memory, if they are not: a private file mapping's written pages are
    /// anonymous too, and are not told from the file's here.
    pages_invalid: Option<String>,
    /// No agent is alive: the workload has no page tables either.
    no_agents: bool,
    /// Why the count is not the workload's, if it is not (the first
    /// reason found).
    invalid: Option<String>,
}

impl Census {
    /// The census of a reading in which a region of the workload may have
    /// been pinned (`pinned`: a `pin` ran at some point).
    pub(crate) fn new(pinned: bool) -> Census {
        Census {
            folios: HashMap::new(),
            small: HashSet::new(),
            pages_invalid: None,
            no_agents: false,
            invalid: pinned
                .then(|| "a folio pinned by the workload may outlive its mappings".into()),
        }
    }

    /// The census of the agents' private anonymous regions now; `pinned`:
    /// a `pin` ran at some point.
    pub(crate) fn of(agents: &Agents, pinned: bool) -> Census {
        let mut census = Census::new(pinned);
        let regions = || {
            agents.procs.iter().flat_map(|(name, p)| {
                p.regions
                    .iter()
                    .filter(|(_, r)| r.anon)
                    .map(move |(region, r)| (name, p.agent.pid, region, r.start, r.len))
            })
        };
        let private_file = agents.procs.iter().find_map(|(name, p)| {
            let (region, _) = p.regions.iter().find(|(_, r)| r.private_file)?;
            Some(format!(
                "{name}'s region {region} is a private file mapping"
            ))
        });
        census.pages_invalid = private_file;
        census.no_agents = agents.procs.is_empty();
        let bytes: u64 = regions().map(|(.., len)| len).sum();
        if bytes > CENSUS_MAX {
            census.invalid = Some(format!(
                "the workload's anonymous regions span {} MiB, more than a reading scans",
                bytes >> 20
            ));
        }
        for (name, pid, region, start, len) in regions() {
            if census.invalid.is_some() {
                break;
            }
            match pagemap::scan_folios(pid, start, start + len) {
                Ok(scan) => census.add((name, region), pid, (start, start + len), &scan),
                Err(e) => census.invalid = Some(e.to_string()),
            }
        }
        census
    }

    /// Adds the folios `scan` found in `[start, end)` of `pid`, the region
    /// `region` of agent `name` (the scan may cover more: whole VMAs).
    /// Only a private anonymous region's folios are anonymous ones.
    pub(crate) fn add(
        &mut self,
        (name, region): (&str, &str),
        pid: i32,
        (start, end): (u64, u64),
        scan: &FolioScan,
    ) {
        if self.invalid.is_some() {
            return;
        }
        if scan.unknown_pages > 0 {
            self.invalid = Some(format!(
                "/proc/kpageflags read 0 for {} pages of {name}'s region {region}",
                scan.unknown_pages
            ));
            return;
        }
        match pagemap::swapped_in(pid, start, end) {
            Ok(false) => {}
            Ok(true) => {
                self.invalid = Some(format!(
                    "a page of {name}'s region {region} is swapped out or under migration"
                ));
                return;
            }
            Err(e) => {
                self.invalid = Some(e.to_string());
                return;
            }
        }
        self.small.extend(scan.small.iter().map(|p| p.0));
        for f in scan.large.iter().filter(|f| (start..end).contains(&f.addr)) {
            let e = self
                .folios
                .entry(f.head.0)
                .or_insert((f.order, false, PageBits::default()));
            e.1 |= f.pmd;
            for (w, m) in e.2.iter_mut().zip(f.mapped) {
                *w |= m;
            }
        }
    }

    /// Each gauge the count gives, with its value; None when the count is
    /// not the workload's.
    pub(crate) fn gauges(&self) -> Option<Vec<(String, i64)>> {
        if self.invalid.is_some() {
            return None;
        }
        let mut per_order = [0i64; HPAGE_PMD_ORDER as usize + 1];
        let mut partial = per_order;
        let (mut pmd_mapped, mut large_pages) = (0, 0);
        for (order, pmd, mapped) in self.folios.values() {
            let o = *order as usize;
            per_order[o] += 1;
            let pages: u32 = mapped.iter().map(|w| w.count_ones()).sum();
            large_pages += i64::from(pages);
            partial[o] += i64::from(pages < 1 << o);
            pmd_mapped += i64::from(*pmd && o == HPAGE_PMD_ORDER as usize);
        }
        let mut out = Vec::new();
        for o in 2..per_order.len() {
            let size = format!("mthp.{}kB", PAGE_KB << o);
            out.push((format!("{size}.nr_anon"), per_order[o]));
            out.push((format!("{size}.nr_anon_partially_mapped"), partial[o]));
        }
        out.push(("vmstat.nr_anon_transparent_hugepages".into(), pmd_mapped));
        if self.pages_invalid.is_none() {
            // NR_ANON_MAPPED: each page mapped anywhere, once
            // (CONFIG_PAGE_MAPCOUNT: `__folio_add_anon_rmap` counts a page
            // when its first mapping comes, `__folio_remove_rmap` when its
            // last goes).
            let pages = self.small.len() as i64 + large_pages;
            out.push(("vmstat.nr_anon_pages".into(), pages));
            out.push(("meminfo.AnonPages".into(), pages * PAGE_KB as i64));
        }
        if self.no_agents {
            // Every agent's mm is gone, its page tables freed (the reading
            // waits for their RCU frees).
            out.push(("vmstat.nr_page_table_pages".into(), 0));
            out.push(("meminfo.PageTables".into(), 0));
        }
        out.push((
            "meminfo.AnonHugePages".into(),
            pmd_mapped * (PAGE_KB << HPAGE_PMD_ORDER) as i64,
        ));
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pagemap::LargeFolio;
    use hugelab_workload::units::Pfn;

    /// A scan of folios (head, order, first address, by a PMD, pages
    /// mapped: a range of page indexes).
    fn scan(large: &[(u64, u8, u64, bool, std::ops::Range<usize>)]) -> FolioScan {
        FolioScan {
            large: large
                .iter()
                .map(|(head, order, addr, pmd, pages)| {
                    let mut mapped = PageBits::default();
                    for p in pages.clone() {
                        mapped[p / 64] |= 1 << (p % 64);
                    }
                    LargeFolio {
                        head: Pfn(*head),
                        order: *order,
                        addr: *addr,
                        pmd: *pmd,
                        mapped,
                    }
                })
                .collect(),
            ..FolioScan::default()
        }
    }

    fn value(c: &Census, name: &str) -> i64 {
        let g = c.gauges().unwrap();
        g.iter().find(|(n, _)| n == name).unwrap().1
    }

    /// Our own pid's address 0..4096 has nothing swapped: the scans below
    /// stand for regions there.
    fn pid() -> i32 {
        std::process::id() as i32
    }

    #[test]
    fn a_folio_shared_after_fork_counts_once_and_a_pmd_anywhere_makes_it_a_thp() {
        let me = pid();
        let mut c = Census::new(false);
        // Parent: a THP by PTEs (its PMD split), all but page 0 mapped; a
        // 64K folio whole; a 32K one, its first half.
        c.add(
            ("a", "r"),
            me,
            (0, 1 << 30),
            &scan(&[
                (512, 9, 0x1000, false, 1..512),
                (64, 4, 0x200000, false, 0..16),
                (32, 3, 0x280000, false, 0..4),
            ]),
        );
        // Child: the same THP by a huge PMD, the same 64K folio, its page
        // 0 unmapped; the 32K folio's second half; a 16K folio's page 1.
        c.add(
            ("b", "r"),
            me,
            (0, 1 << 30),
            &scan(&[
                (512, 9, 0x0, true, 0..512),
                (64, 4, 0x200000, false, 1..16),
                (32, 3, 0x280000, false, 4..8),
                (8, 2, 0x300000, false, 1..2),
            ]),
        );
        assert_eq!(value(&c, "mthp.2048kB.nr_anon"), 1);
        assert_eq!(value(&c, "mthp.64kB.nr_anon"), 1);
        assert_eq!(value(&c, "mthp.32kB.nr_anon"), 1);
        assert_eq!(value(&c, "mthp.16kB.nr_anon"), 1);
        assert_eq!(value(&c, "mthp.128kB.nr_anon"), 0);
        assert_eq!(value(&c, "vmstat.nr_anon_transparent_hugepages"), 1);
        assert_eq!(value(&c, "meminfo.AnonHugePages"), 2048);
        // Partially mapped: only what no agent maps leaves a folio partial.
        assert_eq!(value(&c, "mthp.2048kB.nr_anon_partially_mapped"), 0);
        assert_eq!(value(&c, "mthp.64kB.nr_anon_partially_mapped"), 0);
        assert_eq!(value(&c, "mthp.32kB.nr_anon_partially_mapped"), 0);
        assert_eq!(value(&c, "mthp.16kB.nr_anon_partially_mapped"), 1);
        // Each page mapped anywhere, once: 512 + 16 + 8 + 1, and two small
        // folios, one of them shared.
        let mut small = scan(&[]);
        small.small = vec![Pfn(7), Pfn(9)];
        c.add(("a", "s"), me, (0, 1 << 30), &small);
        small.small = vec![Pfn(9)];
        c.add(("b", "s"), me, (0, 1 << 30), &small);
        assert_eq!(value(&c, "vmstat.nr_anon_pages"), 539);
        assert_eq!(value(&c, "meminfo.AnonPages"), 539 * 4);
        // A private file mapping's pages are not told apart: no page count.
        c.pages_invalid = Some("a's region f is a private file mapping".into());
        let g = c.gauges().unwrap();
        assert!(!g.iter().any(|(n, _)| n == "vmstat.nr_anon_pages"));
        assert_eq!(value(&c, "mthp.64kB.nr_anon"), 1);
        assert!(!g.iter().any(|(n, _)| n == "vmstat.nr_page_table_pages"));
        // With every agent gone, nothing at all.
        let gone = Census {
            no_agents: true,
            ..Census::new(false)
        };
        assert_eq!(value(&gone, "vmstat.nr_page_table_pages"), 0);
        assert_eq!(value(&gone, "meminfo.PageTables"), 0);
        assert_eq!(value(&gone, "vmstat.nr_anon_pages"), 0);
    }

    #[test]
    fn folios_outside_the_region_are_not_the_workloads() {
        let mut c = Census::new(false);
        // The scan covered the whole VMA; the region is its second MiB.
        c.add(
            ("a", "r"),
            pid(),
            (0x100000, 0x200000),
            &scan(&[(64, 4, 0x0, false, 0..16), (80, 4, 0x100000, false, 0..16)]),
        );
        assert_eq!(value(&c, "mthp.64kB.nr_anon"), 1);
    }

    #[test]
    fn unknown_pages_and_pins_leave_no_count() {
        let mut c = Census::new(false);
        let mut s = scan(&[(64, 4, 0x1000, false, 0..16)]);
        s.unknown_pages = 3;
        c.add(("a", "r"), pid(), (0, 1 << 20), &s);
        assert!(c.gauges().is_none());
        assert!(c
            .invalid
            .unwrap()
            .contains("read 0 for 3 pages of a's region r"));
        assert!(Census::new(true).gauges().is_none());
    }
}
