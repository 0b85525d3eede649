//! mremap: a region shrunk, grown in place, or moved with its pages.
//!
//! Follows Linux 6.18 `mm/mremap.c` (`do_mremap`, `check_prep_vma`,
//! `mremap_to`, `mremap_at`, `shrink_vma`, `expand_vma`, `move_vma`,
//! `copy_vma_and_data`, `move_page_tables`, `move_ptes`, `move_normal_pmd`)
//! with `copy_vma` and `vma_merge_extend` of `mm/vma.c` and `move_huge_pmd`
//! of `mm/huge_memory.c`:
//!
//! - shrinking unmaps the tail (`do_vmi_munmap`: a PMD THP the new end cuts
//!   is split, a large folio left partially mapped goes to the deferred
//!   split queue, as `munmap` does);
//! - growing extends the VMA in place when the range ends at its VMA's end
//!   and nothing is mapped after it (`vma_merge_extend`, which merges with
//!   a compatible next VMA whose pgoff continues), else, with MREMAP_MAYMOVE,
//!   moves it, else fails with ENOMEM;
//! - a move (`move_vma`) copies the VMA to the new range with its pgoff
//!   (a VMA without an anon_vma gets the new address's instead: `copy_vma`),
//!   merging there with neighbours whose flags match and whose pgoffs
//!   continue, then moves the page tables: a PMD entry (a THP, the huge
//!   zero page) whole when source and destination extents are a whole PMD
//!   (`move_huge_pmd`), else it is split (`split_huge_pmd`, thp_split_pmd)
//!   and its PTEs moved; a whole PTE table by its PMD entry
//!   (`move_normal_pmd`); otherwise PTE by PTE into a table allocated at the
//!   destination (`move_ptes`). Large folios stay whole and mapped, at the
//!   new address; one the range cuts (a PMD THP split there, an mTHP whose
//!   pages the range holds only some of) is then mapped by two VMAs at two
//!   addresses, the PTEs left behind untouched, and stays fully mapped: a
//!   move removes no rmap, so nothing is queued for deferred split until
//!   a later unmap of either part. Its reverse map needs no update: the
//!   moved VMA keeps the old range's pgoff, so `folio->index` still finds
//!   the folio through it (`vma_address`), in the mover's mm and in a fork
//!   relative's that still maps it at the old address alike. The old
//!   range is then unmapped (nothing is mapped there any more; page tables
//!   no VMA needs are freed). Addresses are realigned
//!   to the PMD below when both are equally misaligned and nothing is mapped
//!   there (`try_realign_addr`).
//! - MREMAP_FIXED (`at=`) first unmaps whatever the new range holds
//!   (`do_munmap`), as MAP_FIXED does: mremap never fails with EEXIST.
//!   Without a resize it moves every VMA of the range, gaps kept
//!   (`remap_move`, Linux 6.17), as one move each.
//!
//! Where the model places a move without `at=` is hugelab's placement rule
//! (`hugelab_workload::placement`), not `get_unmapped_area`: the kernel
//! backend moves to the same address with MREMAP_FIXED.
//!
//! Simplifications: a lazily-freed (MADV_FREE) folio records the address
//! reclaim finds it at, which follows the move; so a move of one that is
//! also mapped outside the moved range (by a fork relative, or, for a
//! large one, by the part of its VMA that stays) is refused as not
//! modelled. HugeTLB regions are refused; the PUD-level moves
//! (`move_normal_pud`, 1 GiB extents) are made PMD by PMD (the same pages
//! mapped; only a 1 GiB-aligned move of 1 GiB or more would move a PMD
//! table page the model allocates anew); VM_ACCOUNT, mlock and the map count
//! limits are not modelled.

use crate::mm_types::{MmStruct, Pfn, Region, Vma, PAGE_SHIFT, PAGE_SIZE, PMD_SIZE, PUD_SIZE};
use crate::mmap::{can_merge_new, do_munmap, vma_merge_new_range};
use crate::pgtable::{pte_index, Pmd, PteTable};
use crate::sparse::page_folio;
use crate::syscall::{resolve_range, unsupported};
use crate::Machine;
use hugelab_workload::placement::{self, TASK_SIZE};
use hugelab_workload::{stmt, BackendError, Errno, Stmt};
use std::collections::BTreeMap;

/// What one mremap asks (the user's part of `struct vma_remap_struct`).
#[derive(Clone, Copy, Debug)]
struct Vrm {
    addr: u64,
    old_len: u64,
    new_len: u64,
    /// MREMAP_FIXED's address (with MREMAP_MAYMOVE).
    fixed: Option<u64>,
    maymove: bool,
}

/// Why an mremap did not happen.
enum Refused {
    Errno(Errno, &'static str),
    Unsupported(&'static str),
    /// A page-table page could not be allocated.
    Oom,
}

/// The `mremap` statement (SYSCALL_DEFINE5(mremap)): afterwards the
/// region names the new place and size.
pub fn sys_mremap(m: &mut Machine, stmt: &Stmt, s: &stmt::Mremap) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range(m, stmt, &s.proc, &s.range)?;
    // Page cache pages moved with their PTEs are not modelled.
    crate::syscall::refuse_file_range(m, stmt, id, start, end, "mremap")?;
    let vrm = Vrm {
        addr: start,
        old_len: end - start,
        new_len: s.new_size.bytes().next_multiple_of(PAGE_SIZE),
        fixed: s.at,
        maymove: s.maymove || s.at.is_some(),
    };
    let region = &s.range.region;
    let res = m.with_mm(id, |m, mm| {
        let addr = do_mremap(m, mm, vrm)?;
        if let Some(at) = vrm.fixed {
            placement::after_fixed_region(&mut mm.mmap_cursor, at, vrm.new_len);
        }
        let len = vrm.new_len;
        mm.regions
            .insert(region.clone(), Region { start: addr, len });
        Ok(())
    });
    match res {
        Ok(()) => Ok(()),
        Err(Refused::Errno(e, why)) => Err(BackendError::errno(stmt, e, format!("mremap: {why}"))),
        Err(Refused::Unsupported(what)) => Err(unsupported(stmt, what)),
        Err(Refused::Oom) => Err(crate::syscall::failed(
            stmt,
            "mremap: the model ran out of memory for a page table",
        )),
    }
}

/// do_mremap: the new address of the range, or why not.
fn do_mremap(m: &mut Machine, mm: &mut MmStruct, vrm: Vrm) -> Result<u64, Refused> {
    let Vrm {
        addr,
        old_len,
        new_len,
        ..
    } = vrm;
    if crate::mm_types::range_has_hugetlb(mm, addr, addr + old_len) {
        return Err(Refused::Unsupported("mremap of a HugeTLB region"));
    }
    if let Some(new_addr) = vrm.fixed {
        // check_mremap_params: vrm_overlaps.
        if addr + old_len > new_addr && new_addr + new_len > addr {
            return Err(Refused::Errno(
                Errno::EINVAL,
                "the new range overlaps the old one",
            ));
        }
        if old_len == new_len {
            return remap_move(m, mm, addr, old_len, new_addr);
        }
    }
    let vma = mm.find_vma(addr).ok_or(Refused::Errno(
        Errno::EFAULT,
        "no mapping at the old address",
    ))?;
    // check_prep_vma: a shrink may cross VMAs (its tail is unmapped); what
    // stays, and what grows or moves, must lie in the one VMA.
    let shrink = new_len < old_len;
    let will_map_new = new_len > old_len || vrm.fixed.is_some();
    if will_map_new && old_len.min(new_len) > vma.end - addr {
        return Err(Refused::Errno(
            Errno::EFAULT,
            "the old range is not one mapping",
        ));
    }
    if let Some(new_addr) = vrm.fixed {
        return mremap_to(m, mm, vrm, new_addr);
    }
    if new_len == old_len {
        return Ok(addr);
    }
    if shrink {
        unmap(m, mm, addr + new_len, addr + old_len);
        return Ok(addr);
    }
    expand_vma(m, mm, vrm, vma)
}

/// remap_move (MREMAP_FIXED without a resize, Linux 6.17): every VMA
/// piece of `[addr, addr + len)` moves to the same offset from `new_addr`
/// (mremap_to each), so the gaps between them stay; EFAULT when nothing is
/// mapped at `addr` (a gap at the end is allowed).
fn remap_move(
    m: &mut Machine,
    mm: &mut MmStruct,
    addr: u64,
    len: u64,
    new_addr: u64,
) -> Result<u64, Refused> {
    if mm.find_vma(addr).is_none() {
        return Err(Refused::Errno(
            Errno::EFAULT,
            "no mapping at the old address",
        ));
    }
    if crate::mm_types::range_has_hugetlb(mm, new_addr, new_addr + len) {
        return Err(Refused::Unsupported("mremap at= over a HugeTLB region"));
    }
    // Each piece moves on its own, but a folio may be mapped across two.
    let moved = check_movable(m, mm, addr, len)?;
    let (end, mut from) = (addr + len, addr);
    while let Some(vma) = mm.vmas_in(from, end).first().copied() {
        let start = vma.start.max(from);
        let piece = vma.end.min(end) - start;
        let to = new_addr + (start - addr);
        unmap(m, mm, to, to + piece);
        copy_vma_and_data(m, mm, start, piece, to, piece)?;
        from = start + piece;
    }
    relocate_folios(m, mm.mm_id, &moved, addr, len, new_addr);
    Ok(new_addr)
}

/// do_munmap of a range the model can always unmap (no HugeTLB VMA in it).
fn unmap(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    if do_munmap(m, mm, start, end).is_err() {
        unreachable!("mremap refuses HugeTLB ranges before it unmaps");
    }
}

/// mremap_to: MREMAP_FIXED. The new range is unmapped first, a shrink
/// unmaps the tail, then the rest moves.
fn mremap_to(m: &mut Machine, mm: &mut MmStruct, vrm: Vrm, new_addr: u64) -> Result<u64, Refused> {
    if crate::mm_types::range_has_hugetlb(mm, new_addr, new_addr + vrm.new_len) {
        return Err(Refused::Unsupported("mremap at= over a HugeTLB region"));
    }
    unmap(m, mm, new_addr, new_addr + vrm.new_len);
    let mut old_len = vrm.old_len;
    if vrm.new_len < old_len {
        unmap(m, mm, vrm.addr + vrm.new_len, vrm.addr + old_len);
        old_len = vrm.new_len;
    }
    move_vma(m, mm, vrm.addr, old_len, new_addr, vrm.new_len)
}

/// expand_vma: in place when the range ends at its VMA's end and nothing
/// is mapped after it (vma_expandable), else moved with MREMAP_MAYMOVE
/// (where the placement rule puts a region of the new size), else ENOMEM.
fn expand_vma(m: &mut Machine, mm: &mut MmStruct, vrm: Vrm, vma: Vma) -> Result<u64, Refused> {
    let delta = vrm.new_len - vrm.old_len;
    let end = vma.end + delta;
    if vma.end == vrm.addr + vrm.old_len && end <= TASK_SIZE && mm.vmas_in(vma.end, end).is_empty()
    {
        vma_merge_extend(m, mm, vma, delta);
        return Ok(vrm.addr);
    }
    if !vrm.maymove {
        return Err(Refused::Errno(
            Errno::ENOMEM,
            "the region cannot grow in place and may not move",
        ));
    }
    let align = placement::default_align(vrm.new_len);
    let new_addr = placement::place_region(&mut mm.mmap_cursor, vrm.new_len, align);
    move_vma(m, mm, vrm.addr, vrm.old_len, new_addr, vrm.new_len)
}

/// vma_merge_extend (mm/vma.c): the VMA grows by `delta` and merges with
/// the next VMA when that one is compatible and its pgoff continues
/// (vma_merge_new_range with the VMA as prev).
fn vma_merge_extend(m: &mut Machine, mm: &mut MmStruct, vma: Vma, delta: u64) {
    let mut grown = Vma {
        end: vma.end + delta,
        ..vma
    };
    if let Some(next) = mm.vmas.get(&grown.end).copied() {
        if can_merge_new(&grown, &next) {
            mm.vmas.remove(&next.start);
            m.anon_vmas.avc_unlink(mm.mm_id, next.start);
            grown = Vma {
                end: next.end,
                anon_vma: grown.anon_vma || next.anon_vma,
                anon_vma_id: if grown.anon_vma {
                    grown.anon_vma_id
                } else {
                    next.anon_vma_id
                },
                fork_child: grown.fork_child || next.fork_child,
                ..grown
            };
        }
    }
    mm.vmas.insert(grown.start, grown);
    // vma_expand: vma_prepare/vma_complete re-insert the expanded VMA's avcs.
    m.anon_vmas.avc_reinsert(mm.mm_id, grown.start);
}

/// move_vma: the range checked movable, copied with its page tables
/// (`copy_vma_and_data`), and its folios' reverse map following them.
/// The new address.
fn move_vma(
    m: &mut Machine,
    mm: &mut MmStruct,
    old_addr: u64,
    old_len: u64,
    new_addr: u64,
    new_len: u64,
) -> Result<u64, Refused> {
    let moved = check_movable(m, mm, old_addr, old_len)?;
    copy_vma_and_data(m, mm, old_addr, old_len, new_addr, new_len)?;
    relocate_folios(m, mm.mm_id, &moved, old_addr, old_len, new_addr);
    Ok(new_addr)
}

/// move_vma's part for one VMA piece once checked: copy_vma (merging at
/// the destination), move_page_tables, and the old range unmapped
/// (`unmap_source_vma`).
fn copy_vma_and_data(
    m: &mut Machine,
    mm: &mut MmStruct,
    old_addr: u64,
    old_len: u64,
    new_addr: u64,
    new_len: u64,
) -> Result<(), Refused> {
    let vma = mm.find_vma(old_addr).expect("checked by do_mremap");
    // copy_vma: an anonymous VMA never faulted takes the new address's pgoff.
    let pgoff = if vma.anon_vma {
        vma.linear_page_index(old_addr)
    } else {
        new_addr >> PAGE_SHIFT
    };
    let copy = Vma {
        start: new_addr,
        end: new_addr + new_len,
        pgoff,
        ..vma
    };
    if vma_merge_new_range(m, mm, copy) == copy {
        // vm_area_dup + anon_vma_clone: the new VMA's avcs are inserted.
        m.anon_vmas.avc_reinsert(mm.mm_id, new_addr);
    }
    move_page_tables(m, mm, old_addr, new_addr, old_len)?;
    unmap(m, mm, old_addr, old_addr + old_len);
    Ok(())
}

/// The lazily-freed folios mapped in `[addr, addr + len)`, whose LRU
/// entry says where reclaim finds them (`swap::folio_mark_lazyfree`) and
/// so follows the move, after checking that the model can move them: a
/// lazily-freed folio must be mapped in the range only (not by a fork
/// relative, nor, for a large one, by the part of its VMA that stays). A
/// large folio that is not lazily freed needs nothing: its reverse map is
/// its index, which the moved VMA's pgoff keeps valid.
fn check_movable(m: &Machine, mm: &MmStruct, addr: u64, len: u64) -> Result<Vec<Pfn>, Refused> {
    const ELSEWHERE: Refused = Refused::Unsupported(
        "mremap of a lazily-freed (MADV_FREE) folio that is also mapped outside the \
         moved range (by a fork relative or the rest of its VMA)",
    );
    let end = addr + len;
    let mut counts: BTreeMap<Pfn, u64> = BTreeMap::new();
    for (index, pmd) in mm.pmds.range(addr / PMD_SIZE..=(end - 1) / PMD_SIZE) {
        let slot = index * PMD_SIZE;
        match pmd {
            Pmd::Huge { pfn, .. } if crate::swap::folio_test_lazyfree(m, *pfn) => {
                let inside = slot >= addr && slot + PMD_SIZE <= end;
                *counts.entry(*pfn).or_default() += u64::from(inside);
            }
            Pmd::Huge { .. } | Pmd::HugeZero { .. } => {}
            Pmd::Table(t) => {
                let (lo, hi) = (addr.max(slot), end.min(slot + PMD_SIZE));
                let first = pte_index(lo);
                let n = ((hi - lo) / PAGE_SIZE) as usize;
                for pte in &t.ptes[first..first + n] {
                    let Some(pfn) = pte.pfn() else { continue };
                    let folio = page_folio(m, pfn);
                    if crate::swap::folio_test_lazyfree(m, folio) {
                        *counts.entry(folio).or_default() += 1;
                    }
                }
            }
        }
    }
    for (&folio, &n) in &counts {
        if crate::rmap::folio_mapcount(m, folio) != n {
            return Err(ELSEWHERE);
        }
    }
    Ok(counts.into_keys().collect())
}

/// The moved lazily-freed folios' LRU entries follow them (see
/// `check_movable`).
///
/// No kernel function: the model's lazily-freed folios record an address.
fn relocate_folios(m: &mut Machine, mm: u32, moved: &[Pfn], addr: u64, len: u64, new_addr: u64) {
    // Downwards too: wrapping arithmetic.
    let delta = new_addr.wrapping_sub(addr);
    for &folio in moved {
        let mut e = m.lru.get(folio);
        let size = PAGE_SIZE << m.zone.memmap.page(folio).order();
        if e.flags != 0 && e.mm == mm && e.addr + size > addr && e.addr < addr + len {
            e.addr = e.addr.wrapping_add(delta);
            m.lru.set(folio, e);
        }
    }
}

/// move_page_tables: every PMD extent of `[old_addr, old_addr + len)` to
/// `new_addr` (see the module doc).
fn move_page_tables(
    m: &mut Machine,
    mm: &mut MmStruct,
    old_addr: u64,
    new_addr: u64,
    len: u64,
) -> Result<(), Refused> {
    let old_end = old_addr + len;
    let (mut old, mut new) = try_realign_addr(mm, old_addr, new_addr, len);
    while old < old_end {
        let extent = (PMD_SIZE - old % PMD_SIZE)
            .min(old_end - old)
            .min(PMD_SIZE - new % PMD_SIZE);
        move_pmd_extent(m, mm, old, new, extent)?;
        old += extent;
        new += extent;
    }
    Ok(())
}

/// try_realign_addr(PMD_MASK): both addresses down to their PMD when they
/// are equally misaligned, the range reaches the next PMD boundary, each
/// starts its VMA and nothing is mapped below it in its PMD (can_align_down).
fn try_realign_addr(mm: &MmStruct, old: u64, new: u64, len: u64) -> (u64, u64) {
    let off = old % PMD_SIZE;
    let can_align_down = |addr: u64| {
        mm.find_vma(addr).is_some_and(|v| v.start == addr)
            && mm.vmas_in(addr - off, addr).is_empty()
    };
    if off == 0 || off != new % PMD_SIZE || len < PMD_SIZE - off {
        return (old, new);
    }
    if can_align_down(old) && can_align_down(new) {
        (old - off, new - off)
    } else {
        (old, new)
    }
}

/// One extent of move_page_tables' loop: the PUD and PMD tables at the
/// destination allocated as the source has them (alloc_new_pud,
/// alloc_new_pmd), then the PMD entry moved whole (move_huge_pmd,
/// move_normal_pmd) or split and its PTEs moved.
fn move_pmd_extent(
    m: &mut Machine,
    mm: &mut MmStruct,
    old: u64,
    new: u64,
    extent: u64,
) -> Result<(), Refused> {
    // get_old_pud: no PMD table above the source, nothing mapped there.
    if !mm.pmd_tables.contains_key(&(old / PUD_SIZE)) {
        return Ok(());
    }
    alloc_table(m, &mut mm.pud_tables, new / (PUD_SIZE << 9))?;
    let (oi, ni) = (old / PMD_SIZE, new / PMD_SIZE);
    let Some(pmd) = mm.pmds.get(&oi) else {
        return Ok(());
    };
    let huge = !matches!(pmd, Pmd::Table(_));
    alloc_table(m, &mut mm.pmd_tables, new / PUD_SIZE)?;
    if extent == PMD_SIZE && !mm.pmds.contains_key(&ni) {
        // move_huge_pmd, or move_normal_pmd: the entry (with a huge
        // entry's deposited table) goes to the destination as it is.
        let pmd = mm.pmds.remove(&oi).expect("present");
        mm.pmds.insert(ni, pmd);
        return Ok(());
    }
    if huge {
        crate::huge_memory::split_huge_pmd(m, mm, oi * PMD_SIZE);
    }
    if !mm.pmds.contains_key(&ni) {
        let page = m.pte_alloc_one().map_err(|_| Refused::Oom)?;
        mm.pmds.insert(ni, Pmd::Table(PteTable::new(page)));
    }
    move_ptes(mm, old, new, extent);
    Ok(())
}

/// The page-table page at `index` of `tables`, allocated if missing.
fn alloc_table(
    m: &mut Machine,
    tables: &mut BTreeMap<u64, Pfn>,
    index: u64,
) -> Result<(), Refused> {
    if let std::collections::btree_map::Entry::Vacant(e) = tables.entry(index) {
        e.insert(m.pte_alloc_one().map_err(|_| Refused::Oom)?);
    }
    Ok(())
}

/// move_ptes: the PTEs of `[old, old + extent)` (one PTE table) to `new`,
/// with their dirty bits; the mapped folios' mapcounts do not change.
fn move_ptes(mm: &mut MmStruct, old: u64, new: u64, extent: u64) {
    let (oi, ni) = (old / PMD_SIZE, new / PMD_SIZE);
    let (from, to) = (pte_index(old), pte_index(new));
    let n = (extent / PAGE_SIZE) as usize;
    let Some(Pmd::Table(mut src)) = mm.pmds.remove(&oi) else {
        unreachable!("move_ptes from a PTE table");
    };
    let mut moved = Vec::with_capacity(n);
    for i in 0..n {
        let pte = std::mem::take(&mut src.ptes[from + i]);
        moved.push((pte, src.pte_dirty(from + i)));
    }
    if oi == ni {
        put_ptes(&mut src, to, &moved);
    } else {
        let Some(Pmd::Table(dst)) = mm.pmds.get_mut(&ni) else {
            unreachable!("move_ptes to a PTE table");
        };
        put_ptes(dst, to, &moved);
    }
    mm.pmds.insert(oi, Pmd::Table(src));
}

fn put_ptes(t: &mut PteTable, to: usize, moved: &[(crate::pgtable::Pte, bool)]) {
    for (i, &(pte, dirty)) in moved.iter().enumerate() {
        debug_assert!(t.ptes[to + i].is_none(), "move_ptes over a present PTE");
        t.ptes[to + i] = pte;
        if dirty {
            t.pte_mkdirty(to + i);
        } else {
            t.pte_mkclean(to + i, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, run, Counters, Errno};

    const THP_ALWAYS: &str = "set transparent_hugepage/enabled always\n\
         set transparent_hugepage/hugepages-2048kB/enabled inherit\n";

    /// Runs `body` after THP `always`, checking the model's invariants
    /// after every statement: the errnos of the failed calls, the counters
    /// at the end, and the VMAs of process `a` (start, end, pgoff).
    fn run_a(body: &str) -> (Vec<Errno>, Counters, Vec<(u64, u64, u64)>) {
        let w = parse("test.hlw", &format!("{THP_ALWAYS}spawn a\n{body}")).unwrap();
        let mut model = Model::default().with_invariant_checks();
        let obs = run(&mut model, &w).unwrap();
        let failures = obs.failed_calls.iter().map(|c| c.errno).collect();
        let counters = obs.snapshots.last().unwrap().counters.clone();
        let vmas = model.machine.mm_of("a").map_or(Vec::new(), |mm| {
            mm.vmas
                .values()
                .map(|v| (v.start, v.end, v.pgoff))
                .collect()
        });
        (failures, counters, vmas)
    }

    const X: u64 = 0x7e10_0000_0000;
    const M: u64 = 1 << 20;

    #[test]
    fn a_moved_vma_keeps_its_pgoff_once_written_and_takes_the_new_one_before() {
        let (failures, _, vmas) = run_a(
            "a mmap n 1M at=0x7e1000000000\n\
             a mmap r 1M at=0x7e2000000000\n\
             a write r:4K\n\
             a mremap r 1M at=0x7e1000100000\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        let old = 0x7e20_0000_0000 >> 12;
        assert_eq!(vmas, [(X, X + M, X >> 12), (X + M, X + 2 * M, old)]);
        let (_, _, vmas) = run_a(
            "a mmap n 1M at=0x7e1000000000\n\
             a mmap r 1M at=0x7e2000000000\n\
             a mremap r 1M at=0x7e1000100000\n",
        );
        assert_eq!(vmas, [(X, X + 2 * M, X >> 12)]);
    }

    #[test]
    fn growing_in_place_merges_with_a_next_vma_whose_pgoff_continues() {
        let (failures, _, vmas) = run_a(
            "a mmap lo 1M at=0x7e1000000000\n\
             a mmap hi 1M at=0x7e1000200000\n\
             a mremap lo 2M\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(vmas, [(X, X + 3 * M, X >> 12)]);
        // Moved away and back, hi no longer continues lo's pgoff.
        let (failures, _, vmas) = run_a(
            "a mmap lo 1M at=0x7e1000000000\n\
             a mmap hi 1M at=0x7e2000200000\n\
             a write hi:4K\n\
             a mremap hi 1M at=0x7e1000200000\n\
             a mremap lo 2M\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(vmas.len(), 2, "{vmas:x?}");
    }

    #[test]
    fn a_moved_thp_splits_and_reclaims_where_it_went() {
        // Half the THP zero-filled: once queued, the shrinker splits it and
        // maps the zero-filled pages to the zero page, in both page tables.
        let (failures, c, _) = run_a(
            "a mmap buf 2M\n\
             a write buf:1M\n\
             a write buf+1M:1M zero\n\
             a mremap buf 2M at=0x7e2000001000\n\
             a munmap buf:4K\n\
             reclaim\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(c["vmstat.thp_split_pmd"], 1);
        assert_eq!(c["vmstat.thp_split_page"], 1);
        assert_eq!(c["smaps.a.buf.Rss"], 1020);
    }

    #[test]
    fn a_thp_moved_down_and_split_keeps_its_reverse_map() {
        // Up, then down again: the folio's index follows it both ways.
        let (failures, c, _) = run_a(
            "a mmap buf 2M at=0x7e1000000000\n\
             a write buf\n\
             a mremap buf 4K at=0x7e2000000000\n\
             a mremap buf 4K at=0x7e1000600000\n\
             reclaim\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(c["vmstat.thp_split_page"], 1);
        assert_eq!(c["smaps.a.buf.Rss"], 4);
    }

    #[test]
    fn errors_are_the_kernels() {
        let (failures, _, _) = run_a(
            "a mmap x 2M\n\
             a mmap y 2M\n\
             a mremap x 10M\n\
             a mmap h 4M\n\
             a munmap h+1M:1M\n\
             a mremap h 8M maymove\n\
             a mremap h 2M at=0x7e0000000000\n\
             a mmap f 2M at=0x7e3000000000\n\
             a mremap f 2M at=0x7e3000100000\n",
        );
        assert_eq!(
            failures,
            [Errno::ENOMEM, Errno::EFAULT, Errno::EFAULT, Errno::EINVAL]
        );
    }

    #[test]
    fn a_thp_a_fork_shares_moves_and_splits_in_both() {
        // b keeps the THP at the old address, a moves it: half unmapped in
        // both, it is partially mapped and the shrinker's split finds both.
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\na mmap buf 2M at=0x7e1000000000\na write buf\na fork b\n\
                 a mremap buf 2M at=0x7e2000000000\na munmap buf:1M\nb munmap buf:1M\nreclaim\n"
            ),
        )
        .unwrap();
        let mut model = Model::default().with_invariant_checks();
        let obs = run(&mut model, &w).unwrap();
        let c = &obs.snapshots.last().unwrap().counters;
        assert_eq!(c["vmstat.thp_split_pmd"], 2);
        assert_eq!(c["vmstat.thp_split_page"], 1);
        assert_eq!(c["smaps.a.buf.Rss"], 1024);
        assert_eq!(c["smaps.b.buf.Rss"], 1024);
        assert_eq!(c["vmstat.nr_anon_pages"], 256);
    }

    #[test]
    fn a_folio_cut_by_the_move_stays_whole_in_two_vmas() {
        // lo and hi are one VMA; the 2M THP at lo is split at the PMD and
        // its upper half moved: one folio, mapped at two addresses.
        let (failures, c, vmas) = run_a(
            "a mmap lo 1M at=0x7e1000000000\n\
             a mmap hi 1M at=0x7e1000100000\n\
             a write lo\n\
             a mremap hi 1M at=0x7e1000500000\n",
        );
        assert!(failures.is_empty(), "{failures:?}");
        assert_eq!(c["mthp.2048kB.nr_anon"], 1);
        assert_eq!(c["vmstat.thp_split_pmd"], 1);
        assert_eq!(c["mthp.2048kB.nr_anon_partially_mapped"], 0);
        assert_eq!(c["smaps.a.Rss"], 2048);
        // The moved VMA keeps the page offsets it had.
        assert_eq!(
            vmas,
            [(X, X + M, X >> 12), (X + 5 * M, X + 6 * M, (X + M) >> 12)]
        );
    }

    #[test]
    fn moving_a_lazily_freed_thp_a_fork_shares_is_refused_as_not_modelled() {
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\na mmap buf 2M\na write buf\na madvise buf FREE\n\
                 a fork b\na mremap buf 2M at=0x7e2000000000\n"
            ),
        )
        .unwrap();
        let e = run(&mut Model::default(), &w).unwrap_err().to_string();
        assert!(e.contains("lazily-freed (MADV_FREE) folio"), "{e}");
        assert!(e.contains("not supported by the model backend"), "{e}");
    }
}
