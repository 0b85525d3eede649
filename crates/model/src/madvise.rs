//! madvise: MADV_HUGEPAGE, MADV_NOHUGEPAGE, MADV_DONTNEED, MADV_FREE,
//! MADV_COLD and MADV_PAGEOUT (MADV_COLLAPSE is in `khugepaged`).
//!
//! Follows Linux 6.18 `mm/madvise.c` and `hugepage_madvise` in
//! `mm/khugepaged.c`: MADV_HUGEPAGE sets VM_HUGEPAGE (clearing VM_NOHUGEPAGE) and
//! registers the mm with khugepaged; MADV_NOHUGEPAGE does the reverse; both split
//! and merge VMAs like mprotect. MADV_DONTNEED zaps the range's pages (splitting
//! a PMD THP it only partly covers); with CONFIG_PT_RECLAIM (x86_64 default, as
//! on the development machines) it also frees every PTE table whose whole
//! 2 MiB range it covered and left empty (`zap_details.reclaim_pt`,
//! mm/pt_reclaim.c), so a later fault there can take a PMD THP again.
//!
//! MADV_COLLAPSE is `khugepaged::madvise_collapse`, in mm/khugepaged.c as in
//! the kernel. MADV_POPULATE_READ/WRITE (`madvise_populate`) fault the range
//! in through `gup::faultin_page_range`.
//!
//! MADV_FREE (`madvise_free_single_vma`, `madvise_free_pte_range`, and
//! `madvise_free_huge_pmd` of mm/huge_memory.c) marks the exclusive folios
//! of the range lazily freed (`swap::folio_mark_lazyfree`) and cleans their
//! PTEs or PMD; MADV_COLD and MADV_PAGEOUT (`madvise_cold_or_pageout_pte_range`)
//! deactivate them (`swap::folio_deactivate`) or reclaim them at once
//! (`vmscan::reclaim_pages`). All three skip a folio another mapping may
//! share (`folio_maybe_mapped_shared`, or a mapcount that is not the folio's
//! page count), and split a large folio the range covers only in part
//! (`split_folio`: its PMD first, and its zero-filled pages go to the zero
//! page), then handle the range folio by folio (a large folio as its
//! batch of PTEs, `madvise_folio_pte_batch`). `can_madv_lru_vma`
//! refuses VM_LOCKED, VM_PFNMAP and HugeTLB VMAs: the model has no mlock,
//! and exec refuses HugeTLB ranges before they get here.
//!
//! Simplifications: no per-cpu LRU batches (see `swap`); the
//! `lru_add_drain` at the start of each call is implicit (the model puts a
//! new folio on the LRU at once); a folio the kernel would fail to trylock
//! is never met. As in the kernel, MADV_FREE checks the mapcount of a small
//! folio only when it is PG_dirty, so an order-0 page fork left shared is
//! marked lazily freed too; reclaim discards it only if every mapping's PTE
//! is still clean (fork copies the dirty bit; a dirty one makes
//! `try_to_unmap_one` mark the folio swapbacked again and keep it).

use crate::huge_memory::split_folio;
use crate::internal::folio_pte_batch;
use crate::khugepaged::khugepaged_enter_vma;
use crate::memory_zap::zap_page_range;
use crate::mm_types::{MmId, MmStruct, Pfn, Vma, PAGE_SIZE, PMD_SIZE};
use crate::mmap::update_vma_flags;
use crate::mms::MmList;
use crate::pgtable::{pte_index, Pmd};
use crate::rmap::{folio_mapcount, folio_maybe_mapped_shared};
use crate::sparse::page_folio;
use crate::swap::{folio_clear_dirty, folio_deactivate, folio_mark_lazyfree, folio_test_dirty};
use crate::syscall::resolve_range_no_hugetlb;
use crate::vmscan::reclaim_pages;
use crate::Machine;
use hugelab_workload::{Advice, BackendError, Errno, Range, Stmt};

/// The `madvise` statement (SYSCALL_DEFINE3(madvise), `madvise_do_behavior`).
pub fn sys_madvise(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
    advice: Advice,
) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range_no_hugetlb(m, stmt, proc, range)?;
    match advice {
        Advice::PopulateRead | Advice::PopulateWrite => {
            let write = advice == Advice::PopulateWrite;
            return madvise_populate(m, stmt, proc, id, start, end, write);
        }
        // madvise_free_single_vma: only anonymous VMAs can be freed lazily.
        Advice::Free if crate::syscall::refuse_file_range(m, stmt, id, start, end, "").is_err() => {
            let msg = "madvise(MADV_FREE) of a file mapping";
            return Err(BackendError::errno(stmt, Errno::EINVAL, msg));
        }
        // MADV_COLLAPSE of a file VMA is collapse_file of its page cache
        // (forced, so even under shmem_enabled never): not modelled.
        Advice::Cold | Advice::Pageout | Advice::Collapse => {
            let what = "madvise COLD, PAGEOUT or COLLAPSE";
            crate::syscall::refuse_file_range(m, stmt, id, start, end, what)?
        }
        _ => {}
    }
    // The LRU advice's rmap walks (splits, reclaim) reach every mm.
    let lru = |m: &mut Machine, advice| {
        m.with_mms(None, |m, mms| madvise_lru(m, mms, id, start, end, advice))
    };
    let covered = match advice {
        Advice::Free => lru(m, LruAdvice::Free),
        Advice::Cold => lru(m, LruAdvice::Cold),
        Advice::Pageout => lru(m, LruAdvice::Pageout),
        Advice::Hugepage => m.with_mm(id, |m, mm| hugepage_madvise(m, mm, start, end, true)),
        Advice::NoHugepage => m.with_mm(id, |m, mm| hugepage_madvise(m, mm, start, end, false)),
        Advice::DontNeed => m.with_mm(id, |m, mm| madvise_dontneed(m, mm, start, end)),
        Advice::PopulateRead | Advice::PopulateWrite => unreachable!("handled above"),
        Advice::Collapse => {
            use crate::khugepaged::madvise_collapse;
            let collapsed = m.with_mm(id, |m, mm| madvise_collapse(m, mm, start, end));
            if let Err(errno) = collapsed {
                let msg = "madvise(MADV_COLLAPSE) failed";
                return Err(BackendError::errno(stmt, errno, msg));
            }
            true
        }
    };
    if !covered {
        return Err(BackendError::errno(
            stmt,
            Errno::ENOMEM,
            "madvise: part of the range is not mapped",
        ));
    }
    Ok(())
}

/// MADV_POPULATE_READ / MADV_POPULATE_WRITE (`madvise_populate`): GUP
/// faults over the range (`gup::faultin_page_range`), counted in PGFAULT and
/// in the task's min_flt like its own faults; the errno of the first
/// obstacle: ENOMEM for a hole, EINVAL for a VMA without the permission,
/// EFAULT for a fault that failed.
fn madvise_populate(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    id: MmId,
    start: u64,
    end: u64,
    write: bool,
) -> Result<(), BackendError> {
    use crate::gup::{faultin_page_range, PopulateError};
    use crate::mm_types::Fault;
    let faults_before = m.stat.event(crate::vmstat::VmEvent::PgFault);
    let result = m.with_mm(id, |m, mm| faultin_page_range(m, mm, start, end, write));
    let faults = m.stat.event(crate::vmstat::VmEvent::PgFault) - faults_before;
    m.tasks.get_mut(proc).expect("the advising task").min_flt += faults;
    let name = if write {
        "MADV_POPULATE_WRITE"
    } else {
        "MADV_POPULATE_READ"
    };
    let (errno, why) = match result {
        Ok(()) => return Ok(()),
        Err(PopulateError::NoVma) => (Errno::ENOMEM, "part of the range is not mapped"),
        Err(PopulateError::Permission) => (Errno::EINVAL, "a VMA of the range forbids the access"),
        Err(PopulateError::Fault(Fault::Sigsegv { .. } | Fault::Sigbus { .. })) => {
            (Errno::EFAULT, "a fault could not be served")
        }
        Err(PopulateError::Fault(Fault::Oom | Fault::OomKilled)) => {
            (Errno::ENOMEM, "no memory for a fault")
        }
    };
    Err(BackendError::errno(
        stmt,
        errno,
        format!("madvise({name}) failed: {why}"),
    ))
}

/// MADV_HUGEPAGE / MADV_NOHUGEPAGE over `[start, end)`; false if part is unmapped.
pub fn hugepage_madvise(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
    hugepage: bool,
) -> bool {
    let (set, clear) = if hugepage {
        (Vma::VM_HUGEPAGE, Vma::VM_NOHUGEPAGE)
    } else {
        (Vma::VM_NOHUGEPAGE, Vma::VM_HUGEPAGE)
    };
    let covered = update_vma_flags(m, mm, start, end, |flags| (flags & !clear) | set);
    if hugepage {
        for vma in mm.vmas_in(start, end) {
            khugepaged_enter_vma(m, mm, &vma);
        }
    }
    covered
}

/// MADV_DONTNEED over `[start, end)`; false if part is unmapped.
///
/// Named for madvise_dontneed_single_vma applied to each VMA of the range (madvise_walk_vmas).
pub fn madvise_dontneed(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) -> bool {
    let mut covered = start;
    for vma in mm.vmas_in(start, end) {
        covered = if vma.start <= covered {
            vma.end
        } else {
            covered
        };
        let (lo, hi) = (vma.start.max(start), vma.end.min(end));
        zap_page_range(m, mm, lo, hi);
        reclaim_pt(m, mm, lo, hi);
    }
    covered >= end
}

/// The PT_RECLAIM step of zap_pte_range: a PTE table whose 2 MiB range lies
/// wholly inside the zapped range, and which holds no entry any more, is
/// cleared from its PMD and freed.
///
/// No one kernel function: zap_pte_range's CONFIG_PT_RECLAIM branch (mm/pt_reclaim.c), done in one step.
fn reclaim_pt(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = start.div_ceil(PMD_SIZE);
    let last = end / PMD_SIZE;
    for index in first..last {
        if let Some(Pmd::Table(t)) = mm.pmds.get(&index) {
            if t.is_empty() {
                if let Some(Pmd::Table(t)) = mm.pmds.remove(&index) {
                    m.pte_free(t.page);
                }
            }
        }
    }
}

/// Which of the three LRU advices a walk carries out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LruAdvice {
    /// MADV_FREE.
    Free,
    /// MADV_COLD.
    Cold,
    /// MADV_PAGEOUT.
    Pageout,
}

/// The part of `[start, end)` each VMA covers, and whether the VMAs cover
/// all of it (else the call ends with ENOMEM, after doing the VMAs there are).
fn vma_ranges(mm: &MmStruct, start: u64, end: u64) -> (Vec<(u64, u64)>, bool) {
    let mut covered = start;
    let mut ranges = Vec::new();
    for vma in mm.vmas_in(start, end) {
        if vma.start <= covered {
            covered = vma.end;
        }
        ranges.push((vma.start.max(start), vma.end.min(end)));
    }
    (ranges, covered >= end)
}

/// MADV_FREE, MADV_COLD or MADV_PAGEOUT over `[start, end)` of mm `id`
/// (madvise_free_single_vma, madvise_cold, madvise_pageout, per VMA);
/// false if part of the range is unmapped.
///
/// No kernel function: the walk madvise_free_single_vma, madvise_cold and madvise_pageout share, which differ only per folio.
pub fn madvise_lru(
    m: &mut Machine,
    mms: &mut MmList,
    id: MmId,
    start: u64,
    end: u64,
    advice: LruAdvice,
) -> bool {
    let (ranges, covered) = vma_ranges(mms.get_mut(id).expect("the caller's mm"), start, end);
    for (lo, hi) in ranges {
        let mut addr = lo;
        while addr < hi {
            let next = ((addr / PMD_SIZE) + 1) * PMD_SIZE;
            let next = next.min(hi);
            match advice {
                LruAdvice::Free => madvise_free_pte_range(m, mms, id, addr, next),
                _ => madvise_cold_or_pageout_pte_range(m, mms, id, addr, next, advice),
            }
            addr = next;
        }
    }
    covered
}

/// The PMD entry of `addr` in mm `id`: a THP's folio, or whether there is a table.
enum PmdKind {
    None,
    Huge(Pfn),
    Table,
}

fn pmd_kind(mms: &mut MmList, id: MmId, addr: u64) -> PmdKind {
    match mms
        .get_mut(id)
        .and_then(|mm| mm.pmds.get(&(addr / PMD_SIZE)))
    {
        Some(Pmd::Huge { pfn, .. }) => PmdKind::Huge(*pfn),
        Some(Pmd::Table(_)) => PmdKind::Table,
        _ => PmdKind::None,
    }
}

/// madvise_free_huge_pmd (mm/huge_memory.c): a THP mapped by the PMD of
/// `[addr, next)`. Skipped when another mm may map it; split when the range
/// covers part of it (then the caller walks the new PTEs); else its PMD is
/// cleaned and the folio lazily freed. True when the PMD was handled whole.
fn madvise_free_huge_pmd(
    m: &mut Machine,
    mms: &mut MmList,
    id: MmId,
    folio: Pfn,
    addr: u64,
    next: u64,
) -> bool {
    if folio_maybe_mapped_shared(m, folio) {
        return true;
    }
    if next - addr != PMD_SIZE {
        split_folio(m, mms, folio);
        return false;
    }
    folio_clear_dirty(m, folio);
    let mm = mms.get_mut(id).expect("the caller's mm");
    if let Some(Pmd::Huge { dirty, .. }) = mm.pmds.get_mut(&(addr / PMD_SIZE)) {
        *dirty = false;
    }
    folio_mark_lazyfree(m, folio, id, addr);
    true
}

/// The next step of a PTE walk over a large folio met at `addr`: the
/// number of its pages mapped from there on inside `[addr, end)`
/// (madvise_folio_pte_batch), or None after splitting it (or trying to)
/// when that is not all of it.
enum LargeStep {
    Whole(usize),
    /// Skip this many PTEs, the folio's batch (shared, or the split failed).
    Skip(usize),
    /// Split: look at the same PTE again.
    Again,
}

/// No kernel function: the large-folio case of madvise_cold_or_pageout_pte_range and madvise_free_pte_range (split, or skip the batch).
fn large_folio_step(
    m: &mut Machine,
    mms: &mut MmList,
    id: MmId,
    folio: Pfn,
    addr: u64,
    end: u64,
) -> LargeStep {
    let mm = mms.get_mut(id).expect("the caller's mm");
    let Some(Pmd::Table(t)) = mm.pmds.get(&(addr / PMD_SIZE)) else {
        unreachable!("a PTE walk without a table");
    };
    let i = pte_index(addr);
    let max = ((end - addr) / PAGE_SIZE) as usize;
    let nr = folio_pte_batch(m, folio, &t.ptes[i..], max);
    if (nr as u64) == 1 << m.zone.memmap.page(folio).order() {
        return LargeStep::Whole(nr);
    }
    if folio_maybe_mapped_shared(m, folio) {
        return LargeStep::Skip(nr);
    }
    if split_folio(m, mms, folio) {
        LargeStep::Again
    } else {
        LargeStep::Skip(nr)
    }
}

/// The folio mapped at `addr` in mm `id`, if a normal page is.
fn pte_folio(m: &Machine, mms: &mut MmList, id: MmId, addr: u64) -> Option<Pfn> {
    let mm = mms.get_mut(id)?;
    let Some(Pmd::Table(t)) = mm.pmds.get(&(addr / PMD_SIZE)) else {
        return None;
    };
    t.ptes[pte_index(addr)].pfn().map(|p| page_folio(m, p))
}

/// The PTE walk both madvise_free_pte_range and
/// madvise_cold_or_pageout_pte_range do over `[addr, next)` inside one PMD:
/// each folio mapped there, a large one as its batch of PTEs in the range
/// (split first when the range holds only part of it, skipped when shared
/// or unsplittable), handed to `f` with its first address and PTE count.
fn for_each_pte_folio(
    m: &mut Machine,
    mms: &mut MmList,
    id: MmId,
    mut addr: u64,
    next: u64,
    mut f: impl FnMut(&mut Machine, &mut MmList, Pfn, u64, usize),
) {
    while addr < next {
        let Some(folio) = pte_folio(m, mms, id, addr) else {
            addr += PAGE_SIZE;
            continue;
        };
        let nr = if m.zone.memmap.page(folio).order() > 0 {
            match large_folio_step(m, mms, id, folio, addr, next) {
                LargeStep::Whole(nr) => nr,
                LargeStep::Skip(nr) => {
                    addr += nr as u64 * PAGE_SIZE;
                    continue;
                }
                LargeStep::Again => continue,
            }
        } else {
            1
        };
        f(m, mms, folio, addr, nr);
        addr += nr as u64 * PAGE_SIZE;
    }
}

/// madvise_free_pte_range over `[addr, next)`, inside one PMD.
fn madvise_free_pte_range(m: &mut Machine, mms: &mut MmList, id: MmId, addr: u64, next: u64) {
    match pmd_kind(mms, id, addr) {
        PmdKind::None => return,
        PmdKind::Huge(folio) => {
            if madvise_free_huge_pmd(m, mms, id, folio, addr, next) {
                return;
            }
            if !matches!(pmd_kind(mms, id, addr), PmdKind::Table) {
                return;
            }
        }
        PmdKind::Table => {}
    }
    for_each_pte_folio(m, mms, id, addr, next, |m, mms, folio, first, nr| {
        let nr_pages = 1u64 << m.zone.memmap.page(folio).order();
        if folio_test_dirty(m, folio) {
            if folio_mapcount(m, folio) != nr_pages {
                return;
            }
            folio_clear_dirty(m, folio);
        }
        let mm = mms.get_mut(id).expect("the caller's mm");
        if let Some(Pmd::Table(t)) = mm.pmds.get_mut(&(first / PMD_SIZE)) {
            t.pte_mkclean(pte_index(first), nr);
        }
        folio_mark_lazyfree(m, folio, id, first);
    });
}

/// madvise_cold_or_pageout_pte_range over `[addr, next)`, inside one PMD:
/// each exclusive folio of the range is deactivated (COLD) or reclaimed
/// (PAGEOUT, `reclaim_pages` on the folios of this PMD at its end).
fn madvise_cold_or_pageout_pte_range(
    m: &mut Machine,
    mms: &mut MmList,
    id: MmId,
    addr: u64,
    next: u64,
    advice: LruAdvice,
) {
    let pageout = advice == LruAdvice::Pageout;
    let mut list = Vec::new();
    match pmd_kind(mms, id, addr) {
        PmdKind::None => return,
        PmdKind::Huge(folio) => {
            if folio_maybe_mapped_shared(m, folio) {
                return;
            }
            if next - addr == PMD_SIZE {
                if pageout {
                    reclaim_pages(m, mms, vec![folio]);
                } else {
                    folio_deactivate(m, folio);
                }
                return;
            }
            if !split_folio(m, mms, folio) {
                return;
            }
        }
        PmdKind::Table => {}
    }
    for_each_pte_folio(m, mms, id, addr, next, |m, _, folio, _, _| {
        let nr_pages = 1u64 << m.zone.memmap.page(folio).order();
        if folio_mapcount(m, folio) != nr_pages {
            return;
        }
        if pageout {
            list.push(folio);
        } else {
            folio_deactivate(m, folio);
        }
    });
    if pageout {
        reclaim_pages(m, mms, list);
    }
}
