//! How much of each large folio the workload really uses, and why the folio
//! exists: the model's side of `hugelab utilization`, which turns the
//! [`FolioUse`] list built here into the report of
//! `hugelab_workload::utilization`.
//!
//! Named after `mm/thp_utilization.c` of the unmerged "THP shrinker" series
//! (seed 004), which walks physical memory and buckets every THP by how many
//! of its subpages are zero-filled. The model walks page tables instead (a
//! process, a region or every process), which is what a live scan through
//! `/proc/PID/pagemap` sees, and knows two things no scan can:
//!
//! - why each large folio exists (`FolioCause`), recorded where Linux 6.18
//!   allocates it: `alloc_anon_folio` / `do_anonymous_page` and
//!   `do_huge_pmd_anonymous_page` / `do_huge_zero_wp_pmd` (mm/memory.c,
//!   mm/huge_memory.c) for `Fault`, `collapse_huge_page` (mm/khugepaged.c)
//!   for `Khugepaged` and `MadviseCollapse`;
//! - per subpage, whether the workload ever stored to it (`pg::WRITTEN`; a
//!   store of zero bytes is a store, so a written page can still be
//!   zero-filled, `pg::ZEROED`). Page content moves with the kernel's
//!   copies ([`copy_content`]: `__collapse_huge_page_copy`, `wp_page_copy`,
//!   fork's `copy_present_page`), so a collapsed THP's subpage is written only
//!   where a written page was copied into it, and the none or zero-page PTEs
//!   `max_ptes_none` lets khugepaged fill become zero-filled, never-written
//!   subpages: the memory bloat of the collapse. `split_folio` keeps both
//!   bits on the order-0 pieces, which leave the large-folio report.
//!
//! Simplifications: the cause is two bits of the head page's flags and the
//! written mark one bit per page (`mm_types::pg`), not kernel state; no
//! mlock, so `FolioUse::locked` is always false. A folio mapped by several
//! processes of the scope is one folio (its subpages mapped if any of them
//! maps them), as `deferred_split_scan` sees it: the per-process views are
//! united by `hugelab_workload::utilization::unite_by_pfn`, the one merge a
//! live scan's views go through too.

use crate::huge_mm::ThpSettings;
use crate::mm_types::{pg, MmStruct, Pfn, HPAGE_PMD_NR, PAGE_SIZE, PMD_SIZE, PTRS_PER_PTE};
use crate::pgtable::Pmd;
use crate::sparse::page_folio;
use crate::{Machine, Model};
use std::collections::BTreeMap;

use hugelab_workload::utilization::{set_subpage, subpage_words, unite_by_pfn};
pub use hugelab_workload::utilization::{FolioCause, FolioUse, ShrinkerSettings};

/// The values of the head's `pg::CAUSE_MASK` field (0: no cause recorded).
const FOLIO_CAUSE_FAULT: u16 = 1;
const FOLIO_CAUSE_KHUGEPAGED: u16 = 2;
const FOLIO_CAUSE_MADVISE_COLLAPSE: u16 = 3;

/// Records why the large folio `folio` was allocated.
pub fn set_folio_cause(m: &mut Machine, folio: Pfn, cause: FolioCause) {
    let bits = match cause {
        FolioCause::Fault => FOLIO_CAUSE_FAULT,
        FolioCause::Khugepaged => FOLIO_CAUSE_KHUGEPAGED,
        FolioCause::MadviseCollapse => FOLIO_CAUSE_MADVISE_COLLAPSE,
    };
    m.zone.memmap.page_mut(folio).set_cause_bits(bits);
}

/// Why the large folio `folio` exists, if the model recorded it.
pub fn folio_cause(m: &Machine, folio: Pfn) -> Option<FolioCause> {
    match m.zone.memmap.page(folio).cause_bits() {
        FOLIO_CAUSE_FAULT => Some(FolioCause::Fault),
        FOLIO_CAUSE_KHUGEPAGED => Some(FolioCause::Khugepaged),
        FOLIO_CAUSE_MADVISE_COLLAPSE => Some(FolioCause::MadviseCollapse),
        _ => None,
    }
}

/// The kernel copies page `from` into the freshly zeroed page `to`
/// (`copy_mc_user_highpage`): `to` gets its content, and what the workload
/// wrote there counts as written in the copy.
pub fn copy_content(m: &mut Machine, from: Pfn, to: Pfn) {
    let src = *m.zone.memmap.page(from);
    let dst = m.zone.memmap.page_mut(to);
    if !src.test(pg::ZEROED) {
        dst.clear(pg::ZEROED);
    }
    if src.test(pg::WRITTEN) {
        dst.set(pg::WRITTEN);
    }
}

/// What a utilization report looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every live process (a folio several of them map counted once).
    All,
    /// One process, all of its address space.
    Process(&'a str),
    /// One region of one process.
    Region { proc: &'a str, region: &'a str },
}

/// A scope naming something that does not exist.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ScopeError {
    #[error("no process '{0}' at this point of the workload (never spawned, or exited)")]
    NoProcess(String),
    #[error("process '{proc}' has no region '{region}'")]
    NoRegion { proc: String, region: String },
}

/// The mapped subpages of one large folio seen in one process.
struct Seen {
    order: u32,
    mapped: [u64; (HPAGE_PMD_NR / 64) as usize],
    pmd_mapped: bool,
}

/// The large folios `mm` maps in `[start, end)`, with the subpages mapped.
fn walk(m: &Machine, mm: &MmStruct, start: u64, end: u64) -> BTreeMap<Pfn, Seen> {
    let mut seen: BTreeMap<Pfn, Seen> = BTreeMap::new();
    if start >= end {
        return seen;
    }
    let mut mark = |folio: Pfn, order: u32, index: usize, pmd: bool| {
        let s = seen.entry(folio).or_insert(Seen {
            order,
            mapped: [0; (HPAGE_PMD_NR / 64) as usize],
            pmd_mapped: false,
        });
        s.mapped[index / 64] |= 1 << (index % 64);
        s.pmd_mapped |= pmd;
    };
    for (index, pmd) in mm.pmds.range(start / PMD_SIZE..=(end - 1) / PMD_SIZE) {
        let slot = index * PMD_SIZE;
        match pmd {
            Pmd::Huge { pfn, .. } => {
                let order = m.zone.memmap.page(*pfn).order();
                for i in 0..HPAGE_PMD_NR as usize {
                    mark(*pfn, order, i, true);
                }
            }
            Pmd::HugeZero { .. } => {}
            Pmd::Table(t) => {
                let lo = ((start.max(slot) - slot) / PAGE_SIZE) as usize;
                let hi = ((end.min(slot + PMD_SIZE) - slot) / PAGE_SIZE) as usize;
                for pte in &t.ptes[lo..hi.min(PTRS_PER_PTE)] {
                    let Some(page) = pte.pfn() else { continue };
                    let folio = page_folio(m, page);
                    let order = m.zone.memmap.page(folio).order();
                    if order > 0 {
                        mark(folio, order, (page.0 - folio.0) as usize, false);
                    }
                }
            }
        }
    }
    seen
}

/// The folios of the walk `view` (of one process), in PFN order, with which
/// of their mapped subpages are zero-filled and which never written.
fn folio_uses_of(m: &Machine, view: BTreeMap<Pfn, Seen>) -> Vec<FolioUse> {
    let mut out = Vec::with_capacity(view.len());
    for (folio, s) in view {
        let (mut mapped, mut zero, mut never_written) = (0, 0, 0);
        let words = subpage_words(s.order as u8);
        let mut zero_bits = vec![0; words];
        let mut never_written_bits = vec![0; words];
        for i in 0..1u64 << s.order {
            if s.mapped[(i / 64) as usize] & (1 << (i % 64)) == 0 {
                continue;
            }
            let p = m.zone.memmap.page(Pfn(folio.0 + i));
            mapped += 1;
            if p.test(pg::ZEROED) {
                zero += 1;
                set_subpage(&mut zero_bits, i as usize);
            }
            if !p.test(pg::WRITTEN) {
                never_written += 1;
                set_subpage(&mut never_written_bits, i as usize);
            }
        }
        out.push(FolioUse {
            order: s.order as u8,
            mapped,
            zero,
            zero_mappings: zero,
            pmd_mapped: s.pmd_mapped,
            locked: false,
            cause: folio_cause(m, folio),
            never_written: Some(never_written),
            queued: Some(m.zone.memmap.page(folio).test(pg::DEFERRED)),
            pfn: Some(folio),
            mapped_bits: s.mapped[..words].to_vec(),
            zero_bits,
            never_written_bits,
        });
    }
    out
}

/// The shrinker settings the model runs with now.
pub fn shrinker_settings(thp: &ThpSettings) -> ShrinkerSettings {
    ShrinkerSettings {
        max_ptes_none: u32::try_from(thp.khugepaged.max_ptes_none).unwrap_or(u32::MAX),
        shrink_underused: thp.shrink_underused,
    }
}

impl Model {
    /// Every large folio mapped in `scope` now, once, in PFN order, with the
    /// subpages the scope maps of it (within the region, for a region
    /// scope). For every process: each process's folios, united by
    /// `unite_by_pfn` as the report unites a scan's (the subpages any
    /// process maps; the zero-filled ones counted once per process mapping
    /// them for the Rss).
    pub fn folio_uses(&self, scope: Scope<'_>) -> Result<Vec<FolioUse>, ScopeError> {
        let m = &self.machine;
        let task = |proc: &str| {
            m.mm_of(proc)
                .ok_or_else(|| ScopeError::NoProcess(proc.to_string()))
        };
        Ok(match scope {
            Scope::All => {
                // Each address space once (threads share theirs).
                let each: Vec<FolioUse> = m
                    .mm_ids_by_task()
                    .into_iter()
                    .filter_map(|id| m.mms.get(id))
                    .flat_map(|mm| folio_uses_of(m, walk(m, mm, 0, u64::MAX)))
                    .collect();
                let mut all = unite_by_pfn(&each);
                all.sort_by_key(|f| f.pfn);
                all
            }
            Scope::Process(proc) => folio_uses_of(m, walk(m, task(proc)?, 0, u64::MAX)),
            Scope::Region { proc, region } => {
                let mm = task(proc)?;
                let r = mm.regions.get(region).ok_or_else(|| ScopeError::NoRegion {
                    proc: proc.to_string(),
                    region: region.to_string(),
                })?;
                folio_uses_of(m, walk(m, mm, r.start, r.start + r.len))
            }
        })
    }

    /// `khugepaged/max_ptes_none` and `shrink_underused` as they are now.
    pub fn shrinker_settings(&self) -> ShrinkerSettings {
        shrinker_settings(&self.machine.thp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_workload::{parse, run};

    /// PMD THPs under MADV_HUGEPAGE, no mTHP, khugepaged fills any hole.
    const SETTINGS: &str = "set transparent_hugepage/enabled madvise\n\
         set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
         set transparent_hugepage/khugepaged/max_ptes_none 511\n";

    /// The model after running `body` (after SETTINGS); no statement may fail.
    fn model_after(body: &str) -> Model {
        let w = parse("test.hlw", &format!("{SETTINGS}{body}")).unwrap();
        let mut model = Model::default().with_invariant_checks();
        let obs = run(&mut model, &w).unwrap();
        assert!(obs.failed_calls.is_empty(), "{:?}", obs.failed_calls);
        model
    }

    /// The folios of `proc`, without the PFN and subpage bitmaps (which the
    /// tests below do not check).
    fn uses(model: &Model, proc: &str) -> Vec<FolioUse> {
        strip(model.folio_uses(Scope::Process(proc)).unwrap())
    }

    fn strip(folios: Vec<FolioUse>) -> Vec<FolioUse> {
        folios
            .into_iter()
            .map(|f| FolioUse {
                pfn: None,
                mapped_bits: vec![],
                zero_bits: vec![],
                never_written_bits: vec![],
                ..f
            })
            .collect()
    }

    fn thp(cause: FolioCause, mapped: u32, zero: u32, pmd: bool, never_written: u32) -> FolioUse {
        FolioUse {
            order: 9,
            mapped,
            zero,
            zero_mappings: zero,
            pmd_mapped: pmd,
            cause: Some(cause),
            never_written: Some(never_written),
            queued: Some(true),
            ..FolioUse::default()
        }
    }

    #[test]
    fn fault_thp_counts_written_pages_and_zero_writes() {
        // 3 non-zero pages, 2 more written with zero bytes: 507 pages never
        // written, 509 zero-filled.
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf:12K\na write buf+12K:8K zero\n",
        );
        assert_eq!(uses(&m, "a"), [thp(FolioCause::Fault, 512, 509, true, 507)]);
    }

    #[test]
    fn fault_mthp_has_its_order_and_cause() {
        let m = model_after(
            "set transparent_hugepage/hugepages-2048kB/enabled never\n\
             set transparent_hugepage/hugepages-64kB/enabled always\n\
             spawn a\na mmap buf 64K align=64K\na write buf:4K\n",
        );
        let u = uses(&m, "a");
        assert_eq!(u.len(), 1);
        assert_eq!(
            (u[0].order, u[0].mapped, u[0].zero, u[0].pmd_mapped),
            (4, 16, 15, false)
        );
        assert_eq!(
            (u[0].cause, u[0].never_written),
            (Some(FolioCause::Fault), Some(15))
        );
    }

    /// Base pages: 100 written, 50 read (zero page), the rest none; then
    /// MADV_HUGEPAGE and `collapse`.
    fn collapsed(collapse: &str) -> Model {
        model_after(&format!(
            "spawn a\na mmap buf 2M align=2M\na madvise buf NOHUGEPAGE\n\
             a write buf:400K\na read buf+400K:200K\n\
             a madvise buf HUGEPAGE\n{collapse}\n"
        ))
    }

    #[test]
    fn khugepaged_collapse_fills_none_and_zero_ptes_with_never_written_pages() {
        // The 412 none or zero-page PTEs max_ptes_none let in are the bloat.
        let m = collapsed("khugepaged");
        assert_eq!(
            uses(&m, "a"),
            [thp(FolioCause::Khugepaged, 512, 412, true, 412)]
        );
    }

    #[test]
    fn madvise_collapse_is_its_own_cause() {
        let m = collapsed("a madvise buf COLLAPSE");
        assert_eq!(
            uses(&m, "a"),
            [thp(FolioCause::MadviseCollapse, 512, 412, true, 412)]
        );
    }

    #[test]
    fn collapse_copies_written_zero_pages_as_written() {
        // 10 pages written with zero bytes: zero-filled, but written.
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf NOHUGEPAGE\n\
             a write buf:40K zero\na write buf+40K:40K\n\
             a madvise buf HUGEPAGE\na madvise buf COLLAPSE\n",
        );
        assert_eq!(
            uses(&m, "a"),
            [thp(FolioCause::MadviseCollapse, 512, 502, true, 492)]
        );
    }

    #[test]
    fn split_pieces_leave_the_report_and_keep_their_written_bits() {
        // 100 pages written; after the split the pieces are order 0. A
        // collapse of them copies the 100 written pages again: the written
        // bits survived the split (the zero-filled pages became the zero page).
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf:400K\nsplit a buf\n",
        );
        assert_eq!(uses(&m, "a"), []);
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf:400K\nsplit a buf\na madvise buf COLLAPSE\n",
        );
        assert_eq!(
            uses(&m, "a"),
            [thp(FolioCause::MadviseCollapse, 512, 412, true, 412)]
        );
    }

    #[test]
    fn fork_shares_the_folio_counted_once_and_cow_copies_are_small() {
        // The child writes one page of the shared THP: its PMD is split and
        // that page copied into an order-0 folio; the parent keeps the PMD.
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf:8K\na fork b\nb write buf+1M:4K\n",
        );
        assert_eq!(uses(&m, "a"), [thp(FolioCause::Fault, 512, 510, true, 510)]);
        assert_eq!(
            uses(&m, "b"),
            [thp(FolioCause::Fault, 511, 509, false, 509)]
        );
        // Together: one folio, fully mapped (the child's hole is mapped by
        // the parent), its zero-filled subpages in both processes' Rss.
        let all = strip(m.folio_uses(Scope::All).unwrap());
        assert_eq!(
            all,
            [FolioUse {
                zero_mappings: 510 + 509,
                ..thp(FolioCause::Fault, 512, 510, true, 510)
            }]
        );
        // The copy is written by the child, and carries no cause.
        let copy = crate::pagewalk::follow_page(
            m.machine.mm_of("b").unwrap(),
            m.machine.mm_of("b").unwrap().regions["buf"].start + (1 << 20),
        )
        .unwrap();
        let page = m.machine.zone.memmap.page(copy);
        assert!(page.test(pg::WRITTEN) && !page.test(pg::ZEROED));
        assert_eq!(folio_cause(&m.machine, copy), None);
    }

    #[test]
    fn every_process_unites_never_written_subpage_by_subpage() {
        // After fork each process copies 100 subpages of the shared THP on
        // write (wp_page_copy): b maps all but 256-355, a all but 384-483.
        // Together all 512, of which only 0-1 were written.
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf:8K\na fork b\nb write buf+1M:400K\na write buf+1536K:400K\n",
        );
        for p in ["a", "b"] {
            assert_eq!(uses(&m, p)[0].never_written, Some(410));
        }
        let all = strip(m.folio_uses(Scope::All).unwrap());
        assert_eq!(
            all,
            [FolioUse {
                zero_mappings: 410 + 410,
                ..thp(FolioCause::Fault, 512, 510, false, 510)
            }]
        );
    }

    #[test]
    fn write_to_huge_zero_pmd_allocates_a_thp_with_one_written_page() {
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a read buf\na write buf+4K:4K\n",
        );
        assert_eq!(uses(&m, "a"), [thp(FolioCause::Fault, 512, 511, true, 511)]);
    }

    #[test]
    fn pin_faults_without_writing() {
        // GUP's write fault allocates the THP but stores nothing.
        let m = model_after("spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\na pin buf\n");
        assert_eq!(uses(&m, "a"), [thp(FolioCause::Fault, 512, 512, true, 512)]);
    }

    #[test]
    fn region_scope_counts_only_the_region_and_bad_names_are_errors() {
        // A THP half unmapped: the region sees the 256 pages still mapped.
        let m = model_after(
            "spawn a\na mmap buf 2M align=2M\na madvise buf HUGEPAGE\n\
             a write buf\na mmap other 64K\na munmap buf+1M:1M\n",
        );
        let r = strip(
            m.folio_uses(Scope::Region {
                proc: "a",
                region: "buf",
            })
            .unwrap(),
        );
        assert_eq!(r, [thp(FolioCause::Fault, 256, 0, false, 0)]);
        assert!(m
            .folio_uses(Scope::Region {
                proc: "a",
                region: "other",
            })
            .unwrap()
            .is_empty());
        assert_eq!(
            m.folio_uses(Scope::Process("z")),
            Err(ScopeError::NoProcess("z".into()))
        );
        assert!(matches!(
            m.folio_uses(Scope::Region {
                proc: "a",
                region: "nope"
            }),
            Err(ScopeError::NoRegion { .. })
        ));
    }
}
