//! Address spaces: `mm_struct`, VMAs, mmap/munmap, VMA split and merge,
//! brk and stack growth.
//!
//! Follows Linux 6.18 `mm/mmap.c` and `mm/vma.c` (`__split_vma`,
//! `vma_merge_existing_range`, `do_vmi_munmap`, `free_pgtables`, `exit_mmap`)
//! and `vma_adjust_trans_huge` from `mm/huge_memory.c`, which splits a PMD
//! mapping that a new VMA boundary would cut.
//!
//! Simplifications: anonymous private mappings, HugeTLB mappings
//! (`hugetlb`), private mappings of the workload's files and shared
//! anonymous mappings (`filemap`: a file VMA's `vm_file`/`vm_pgoff` are
//! its `FileVma`; a shared anonymous VMA's object is evicted when its last
//! VMA goes, `shmem_fput`) only; a VMA records only
//! whether it has an anon_vma — the anon_vma itself is one per mm
//! (`rmap::AnonVmas`), so two neighbouring VMAs of one region merge when
//! their flags match, which is when the kernel merges them too, as they share
//! the region's anon_vma; regions are
//! placed by hugelab's own rule (below) rather than by the kernel's top-down
//! search, so that both backends place them the same way.
//!
//! Placement: `hugelab_workload::placement`, the rule both backends share,
//! so a region has the same address (and page-table shape) on both; or, with
//! `at=`, the address given (MAP_FIXED_NOREPLACE: EEXIST over a VMA), where
//! the new VMA merges with compatible neighbours as `vma_merge_new_range`
//! merges them (`mm/vma.c`; see `vma_merge_new_range` below for the anon_vma
//! rule and its simplification). A VMA's `vm_pgoff` is its address at mmap
//! (an anonymous private mapping's, `do_mmap`), follows its start through
//! splits and stays with it when `mremap` moves it; two VMAs merge only when
//! the lower one's pgoff plus its pages is the upper one's
//! (`can_vma_merge_after`/`_before`). `khugepaged_enter_vma` at mmap is not modelled, as
//! for placed regions (the model registers the mm at fault and madvise).
//! `vma_merge_range` (mprotect, madvise) takes the same rules. Each VMA's
//! anon_vma has an identity (`Vma::anon_vma_id`): a split's two parts share
//! it, so they merge again; two regions each written on its own keep two.
//! The model does not reuse a neighbour's anon_vma at `anon_vma_prepare`
//! (`find_mergeable_anon_vma`): a VMA written first gets one of its own.
//!
//! The anonymous mmap flags the language has: MAP_STACK is VM_NOHUGEPAGE
//! (`calc_vm_flag_bits`, 6.18), MAP_GROWSDOWN is VM_GROWSDOWN with the VMA
//! at first the region's top part, grown by `expand_stack` on a fault below
//! it (stack_guard_gap checked; RLIMIT_STACK taken as its 8 MiB default),
//! MAP_POPULATE is `gup::mm_populate` after the mapping. `brk`
//! (`sys_brk`, `do_brk_flags`) moves a heap's break: a grow expands the brk
//! VMA or maps one of its own, a shrink unmaps the tail; mm->start_brk and
//! mm->brk are the heap region's start and size.
//!
//! Page tables: PTE tables, and the PMD and PUD tables above them, are
//! allocated at fault and freed by free_pgtables when no VMA is left in
//! their range, as `free_pgd_range` does with the floor and ceiling of the
//! neighbouring VMAs. The P4D and PGD levels are shared with the process's
//! own mappings and never change.

use crate::hugetlb;
use crate::memory_zap::zap_page_range;
use crate::mm_types::{
    FileVma, HugetlbVma, MmStruct, Region, Vma, PAGE_SHIFT, PAGE_SIZE, PMD_SIZE, PUD_SIZE,
};
use crate::pgtable::Pmd;
use crate::syscall::{failed, mm_id_of, resolve_range, unsupported, vm_prot};
use crate::Machine;
use hugelab_workload::{placement, stmt, BackendError, Errno, Prot, Range, Stmt};

impl MmStruct {
    /// do_mmap of an anonymous private region; returns its start address.
    pub fn do_mmap(
        &mut self,
        name: &str,
        len: u64,
        align: Option<u64>,
        prot: u32,
        file: Option<FileVma>,
    ) -> u64 {
        let align = align.unwrap_or(placement::default_align(len));
        self.map_region(name, len, align, prot, None, file)
    }

    /// do_mmap of an anonymous private region whose VMA is only its top
    /// `mapped` bytes (a MAP_GROWSDOWN stack's first VMA; all of it
    /// otherwise), with VMA flags `flags`; returns the region's start.
    pub fn do_mmap_top(
        &mut self,
        name: &str,
        len: u64,
        mapped: u64,
        align: Option<u64>,
        flags: u32,
        file: Option<FileVma>,
    ) -> u64 {
        let align = align.unwrap_or(placement::default_align(len));
        let start = self.map_region(name, len, align, flags, None, file);
        if mapped < len {
            let vma = self.vmas.remove(&start).expect("just mapped");
            let top = start + len - mapped;
            self.vmas.insert(top, Vma { start: top, ..vma });
        }
        start
    }

    /// do_mmap of a HugeTLB region (MAP_HUGETLB; its file and reservation
    /// already made by `hugetlb::hugetlb_mmap`), aligned to its page size.
    ///
    /// No kernel function of its own: the part of do_mmap a MAP_HUGETLB mapping takes once hugetlbfs_file_mmap has run.
    pub fn do_mmap_hugetlb(
        &mut self,
        name: &str,
        len: u64,
        align: u64,
        prot: u32,
        hv: HugetlbVma,
    ) -> u64 {
        self.map_region(name, len, align, prot, Some(hv), None)
    }

    /// A new region in a VMA of its own, placed by hugelab's rule.
    fn map_region(
        &mut self,
        name: &str,
        len: u64,
        align: u64,
        prot: u32,
        hugetlb: Option<HugetlbVma>,
        file: Option<FileVma>,
    ) -> u64 {
        let start = placement::place_region(&mut self.mmap_cursor, len, align);
        self.vmas.insert(
            start,
            Vma {
                start,
                end: start + len,
                flags: prot,
                // A file's offset; a private anonymous mapping's address;
                // a shared anonymous one's 0 (do_mmap).
                pgoff: file.map_or(start >> PAGE_SHIFT, |f| f.pgoff),
                anon_vma: false,
                anon_vma_id: 0,
                fork_child: false,
                hugetlb,
                file,
            },
        );
        self.regions.insert(name.to_string(), Region { start, len });
        start
    }
}

/// An `at=` mapping overlaps a mapping already there
/// (MAP_FIXED_NOREPLACE: EEXIST).
#[derive(Debug)]
pub struct Overlaps;

/// do_mmap with MAP_FIXED_NOREPLACE of an anonymous private region at
/// `start` exactly; `__mmap_region` then merges it with a compatible
/// neighbour (`vma_merge_new_range`). Placement moves past it
/// (`placement::after_fixed_region`).
///
/// The VMA is the region's top `mapped` bytes (all of it but for a
/// MAP_GROWSDOWN stack, whose region is what it may grow into: that must be
/// free too), with VMA flags `flags`.
#[allow(clippy::too_many_arguments)]
pub fn do_mmap_fixed(
    m: &mut Machine,
    mm: &mut MmStruct,
    name: &str,
    start: u64,
    len: u64,
    mapped: u64,
    flags: u32,
    file: Option<FileVma>,
) -> Result<(), Overlaps> {
    let end = start + len;
    if !mm.vmas_in(start, end).is_empty() {
        return Err(Overlaps);
    }
    let vma = Vma {
        start: end - mapped,
        end,
        flags,
        pgoff: file.map_or((end - mapped) >> PAGE_SHIFT, |f| f.pgoff),
        anon_vma: false,
        anon_vma_id: 0,
        fork_child: false,
        hugetlb: None,
        file,
    };
    placement::after_fixed_region(&mut mm.mmap_cursor, start, len);
    mm.regions.insert(name.to_string(), Region { start, len });
    vma_merge_new_range(m, mm, vma);
    Ok(())
}

/// Whether a new anonymous VMA (`vma`: a new mapping, with no anon_vma
/// yet, or `mremap`'s copy, with its source's) can merge with its
/// neighbour `tgt` (`can_vma_merge_after`/`_before`): equal flags, neither
/// VM_HUGETLB (VM_SPECIAL), continuous pgoffs (the lower one's pgoff plus
/// its pages is the upper one's), and `is_mergeable_anon_vma`: an anon_vma
/// only one of the two has did not come from a fork
/// (`vma_had_uncowed_parents`), and two that both have one have the same
/// (`Vma::anon_vma_id`).
pub(crate) fn can_merge_new(vma: &Vma, tgt: &Vma) -> bool {
    let (lo, hi) = if tgt.start < vma.start {
        (tgt, vma)
    } else {
        (vma, tgt)
    };
    files_continuous(lo, hi)
        && tgt.flags == vma.flags
        && tgt.hugetlb.is_none()
        && vma.hugetlb.is_none()
        && lo.pgoff + lo.pages() == hi.pgoff
        && !(vma.anon_vma && tgt.anon_vma && vma.anon_vma_id != tgt.anon_vma_id)
        && anon_vmas_mergeable(vma, tgt)
}

/// Whether `next` continues `prev`'s mapping (the vm_file and vm_pgoff
/// tests of `can_vma_merge_after`): both anonymous, or both of one file
/// with `next`'s offset where `prev`'s ends.
fn files_continuous(prev: &Vma, next: &Vma) -> bool {
    match (prev.file, next.file) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.inode == b.inode && a.pgoff + ((prev.end - prev.start) >> PAGE_SHIFT) == b.pgoff
        }
        _ => false,
    }
}

/// vma_merge_new_range (mm/vma.c) for a new anonymous VMA: merged with the
/// VMA that ends at its start and the one that starts at its end when each
/// is compatible (`can_merge_new`); with both only when prev and next are
/// compatible with each other too (`is_mergeable_anon_vma(prev, next)`:
/// not two different anon_vmas; the two parts of a VMA a hole was punched
/// in share one), else with prev alone. The expanded VMA's
/// avcs are re-inserted (`vma_expand`: `vma_prepare`/`vma_complete`), the
/// removed one's unlinked. No merge: the new VMA goes in alone. Returns
/// the VMA that holds the new range.
pub(crate) fn vma_merge_new_range(m: &mut Machine, mm: &mut MmStruct, vma: Vma) -> Vma {
    let prev = mm
        .vmas
        .range(..vma.start)
        .next_back()
        .map(|(_, v)| *v)
        .filter(|p| p.end == vma.start && can_merge_new(&vma, p));
    let next = mm
        .vmas
        .get(&vma.end)
        .copied()
        .filter(|n| can_merge_new(&vma, n));
    let next = match (prev, next) {
        (Some(p), Some(n)) if p.anon_vma && n.anon_vma && p.anon_vma_id != n.anon_vma_id => None,
        (_, n) => n,
    };
    let mut merged = vma;
    for old in [prev, next].into_iter().flatten() {
        mm.vmas.remove(&old.start);
        m.anon_vmas.avc_unlink(mm.mm_id, old.start);
        merged = Vma {
            // The merged VMA's offset is that of its first part.
            file: if old.start < merged.start {
                old.file
            } else {
                merged.file
            },
            start: merged.start.min(old.start),
            pgoff: if old.start < merged.start {
                old.pgoff
            } else {
                merged.pgoff
            },
            end: merged.end.max(old.end),
            anon_vma: merged.anon_vma || old.anon_vma,
            anon_vma_id: if merged.anon_vma {
                merged.anon_vma_id
            } else {
                old.anon_vma_id
            },
            fork_child: merged.fork_child || old.fork_child,
            ..merged
        };
    }
    mm.vmas.insert(merged.start, merged);
    if merged != vma {
        m.anon_vmas.avc_reinsert(mm.mm_id, merged.start);
    }
    merged
}

/// __split_vma at `addr`, if a VMA straddles it; first splits a PMD mapping
/// that the new boundary would cut (vma_adjust_trans_huge).
pub fn split_vma(m: &mut Machine, mm: &mut MmStruct, addr: u64) {
    let Some(vma) = mm.find_vma(addr) else { return };
    if vma.start == addr {
        return;
    }
    if let Some(hv) = vma.hugetlb {
        // The new VMA's file offset moves with its start; hugetlb_vm_op_open
        // takes its references.
        let upper = hv.at(&vma, addr);
        hugetlb::hugetlb_vm_op_open(m, &upper);
        mm.vmas.insert(vma.start, Vma { end: addr, ..vma });
        mm.vmas.insert(
            addr,
            Vma {
                start: addr,
                pgoff: vma.linear_page_index(addr),
                hugetlb: Some(upper),
                ..vma
            },
        );
        return;
    }
    if !addr.is_multiple_of(PMD_SIZE) {
        crate::huge_memory::split_huge_pmd(m, mm, addr & !(PMD_SIZE - 1));
    }
    mm.vmas.insert(vma.start, Vma { end: addr, ..vma });
    let file = vma.file.map(|f| f.at(&vma, addr));
    mm.vmas.insert(
        addr,
        Vma {
            start: addr,
            pgoff: vma.linear_page_index(addr),
            file,
            ..vma
        },
    );
    // anon_vma_clone links the new VMA; vma_complete re-inserts the old one.
    m.anon_vmas.avc_reinsert(mm.mm_id, addr);
    m.anon_vmas.avc_reinsert(mm.mm_id, vma.start);
}

/// Merges neighbouring VMAs with equal flags around `[start, end)` (vma_merge).
///
/// Named for vma_merge (now vma_merge_existing_range), applied around a range.
pub fn vma_merge_range(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = mm
        .vmas
        .range(..start)
        .next_back()
        .map_or(start, |(s, _)| *s);
    let keys: Vec<u64> = mm.vmas.range(first..=end).map(|(s, _)| *s).collect();
    let mut prev: Option<Vma> = None;
    for key in keys {
        let vma = mm.vmas[&key];
        match prev {
            // VM_HUGETLB VMAs never merge (VM_DONTEXPAND is VM_SPECIAL);
            // is_mergeable_anon_vma: when one of the two has an anon_vma
            // and the other none, the one that has it must not have come
            // from a fork (cases 1 and 2); both with one: the same (case 3).
            Some(p)
                if p.end == vma.start
                    && p.flags == vma.flags
                    && p.pgoff + p.pages() == vma.pgoff
                    && p.hugetlb.is_none()
                    && vma.hugetlb.is_none()
                    && files_continuous(&p, &vma)
                    && anon_vmas_mergeable(&p, &vma) =>
            {
                mm.vmas.remove(&key);
                let merged = Vma {
                    end: vma.end,
                    anon_vma: p.anon_vma || vma.anon_vma,
                    anon_vma_id: if p.anon_vma {
                        p.anon_vma_id
                    } else {
                        vma.anon_vma_id
                    },
                    ..p
                };
                mm.vmas.insert(p.start, merged);
                // The expanded VMA's avcs are re-inserted, the other's unlinked.
                m.anon_vmas.avc_unlink(mm.mm_id, key);
                m.anon_vmas.avc_reinsert(mm.mm_id, p.start);
                prev = Some(merged);
            }
            _ => prev = Some(vma),
        }
    }
}

/// is_mergeable_anon_vma of two existing neighbours (either may be the
/// VMA being changed): an anon_vma only one of them has was not copied by
/// fork (`vma_had_uncowed_parents`); two that both have one have the same.
fn anon_vmas_mergeable(a: &Vma, b: &Vma) -> bool {
    match (a.anon_vma, b.anon_vma) {
        (true, false) => !a.fork_child,
        (false, true) => !b.fork_child,
        (true, true) => a.anon_vma_id == b.anon_vma_id,
        (false, false) => true,
    }
}

/// Applies `update` to the flags of every VMA in `[start, end)`, splitting at
/// the edges and merging afterwards. Returns false if part of the range has no VMA.
///
/// No kernel function: vma_modify_flags (split, apply, merge) over every VMA of a range, as madvise and mprotect loop it.
pub fn update_vma_flags(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
    mut update: impl FnMut(u32) -> u32,
) -> bool {
    update_vmas(m, mm, start, end, |vma| update(vma.flags))
}

/// `update_vma_flags` with each VMA's new flags computed from all of it.
pub fn update_vmas(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
    mut update: impl FnMut(&Vma) -> u32,
) -> bool {
    split_vma(m, mm, start);
    split_vma(m, mm, end);
    let mut covered = start;
    for vma in mm.vmas_in(start, end) {
        covered = if vma.start <= covered {
            vma.end
        } else {
            covered
        };
        let flags = update(&vma);
        mm.vmas.insert(vma.start, Vma { flags, ..vma });
    }
    vma_merge_range(m, mm, start, end);
    covered >= end
}

/// A VMA refused to split where munmap asked (`vm_ops->may_split`).
#[derive(Debug)]
pub struct SplitRefused;

/// do_vmi_munmap: unmaps `[start, end)`, zapping its pages and freeing page
/// tables no VMA needs any more. EINVAL, and nothing done, when an end of
/// the range would cut a HugeTLB VMA inside a huge page
/// (`hugetlb_vm_op_split`; the kernel may have split the VMA at a valid
/// start by then, which changes no counter).
pub fn do_munmap(
    m: &mut Machine,
    mm: &mut MmStruct,
    start: u64,
    end: u64,
) -> Result<(), SplitRefused> {
    for addr in [start, end] {
        if let Some(vma) = mm.find_vma(addr) {
            match vma.hugetlb {
                Some(hv) if vma.start != addr && !hugetlb::hugetlb_vm_op_split(&hv, addr) => {
                    return Err(SplitRefused)
                }
                _ => {}
            }
        }
    }
    split_vma(m, mm, start);
    split_vma(m, mm, end);
    let vmas = mm.vmas_in(start, end);
    unmap_vmas(m, mm, &vmas);
    free_pgtables(m, mm, start, end);
    Ok(())
}

/// unmap_vmas, then remove_vma for each (`vms_clear_ptes`,
/// `vms_complete_munmap_vmas`; `exit_mmap`): no VMA is closed before every
/// VMA is zapped. A HugeTLB VMA's pages are put once its own zap is done:
/// on the kernel a page one VMA frees already counts when the next VMA is
/// zapped (`__unmap_hugepage_range` tests `surplus_huge_pages`), as
/// `scenarios/hugetlb-exit-zaps-every-mapping-before-closing.hlw` shows.
fn unmap_vmas(m: &mut Machine, mm: &mut MmStruct, vmas: &[Vma]) {
    for vma in vmas {
        if vma.hugetlb.is_some() {
            let gathered = hugetlb::unmap_hugepage_range(m, mm, vma, vma.start, vma.end);
            hugetlb::tlb_finish_mmu(m, gathered);
        } else {
            zap_page_range(m, mm, vma.start, vma.end);
        }
    }
    for vma in vmas {
        mm.vmas.remove(&vma.start);
        m.anon_vmas.avc_unlink(mm.mm_id, vma.start);
        if let Some(hv) = vma.hugetlb {
            hugetlb::hugetlb_vm_op_close(m, vma, &hv);
        }
    }
    for vma in vmas {
        if let Some(f) = vma.file.filter(|f| f.shared) {
            shmem_fput(m, mm, f.inode);
        }
    }
}

/// fput of a shared anonymous mapping's shmem object as a VMA of it goes:
/// the last VMA (in any mm) evicts it and frees its pages.
fn shmem_fput(m: &mut Machine, mm: &MmStruct, inode: u32) {
    let maps = |mm: &MmStruct| {
        mm.vmas
            .values()
            .any(|v| v.file.is_some_and(|f| f.inode == inode))
    };
    if !maps(mm) && !m.mms.iter().any(maps) {
        crate::filemap::shmem_evict_inode(m, inode);
    }
}

/// free_pgtables: frees the page tables of PMD slots around `[start, end)` that
/// no VMA overlaps any more. Like free_pgd_range, it visits only the tables
/// that exist (skipping `pXd_none` entries), so unmapping a huge, barely
/// touched range costs what it mapped, not its size.
fn free_pgtables(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = start / PMD_SIZE;
    let last = (end - 1) / PMD_SIZE;
    let present: Vec<u64> = mm.pmds.range(first..=last).map(|(i, _)| i).collect();
    for index in present {
        let slot = index * PMD_SIZE;
        if !mm.vmas_in(slot, slot + PMD_SIZE).is_empty() {
            continue;
        }
        match mm.pmds.remove(&index) {
            Some(Pmd::Table(t)) => {
                debug_assert!(t.is_empty(), "freeing a page table that still maps pages");
                m.pte_free(t.page);
            }
            Some(_) => unreachable!("huge PMD left behind by zap"),
            None => {}
        }
    }
    // free_pmd_range / free_pud_range: the tables above, once their whole
    // range holds no VMA.
    for (size, tables) in [
        (PUD_SIZE, &mut mm.pmd_tables),
        (PUD_SIZE << 9, &mut mm.pud_tables),
    ] {
        let present: Vec<u64> = tables
            .range(start / size..=(end - 1) / size)
            .map(|(&i, _)| i)
            .collect();
        for index in present {
            let slot = index * size;
            let used = mm
                .vmas
                .range(..slot + size)
                .next_back()
                .is_some_and(|(_, v)| v.end > slot);
            if !used {
                if let Some(pfn) = tables.remove(&index) {
                    m.pte_free(pfn);
                }
            }
        }
    }
}

/// exit_mmap: tears the whole address space down.
pub fn exit_mmap(m: &mut Machine, mm: &mut MmStruct) {
    let vmas: Vec<Vma> = mm.vmas.values().copied().collect();
    unmap_vmas(m, mm, &vmas);
    for vma in &vmas {
        free_pgtables(m, mm, vma.start, vma.end);
    }
    crate::huge_memory::mm_put_huge_zero_folio(m, mm);
    debug_assert!(mm.pmds.is_empty() && mm.anon_rss == 0 && mm.hugetlb_ptes.is_empty());
}

/// The `mmap` statement (SYSCALL_DEFINE6(mmap_pgoff), `ksys_mmap_pgoff`):
/// an anonymous private mapping, or a HugeTLB one (`MAP_HUGETLB`, private or
/// `MAP_SHARED`) whose pages the pool reserves at once. MAP_POPULATE's
/// `mm_populate`, which `vm_mmap_pgoff` runs after the mapping is made, is
/// the caller's (`exec`): it is GUP's, which this module stays below.
pub fn sys_mmap(m: &mut Machine, stmt: &Stmt, s: &stmt::Mmap) -> Result<(), BackendError> {
    let (proc, region, size, align, shared) = (&s.proc, &s.region, s.size, s.align, s.shared);
    let id = mm_id_of(m, stmt, proc)?;
    if m.mms
        .get(id)
        .expect("a task's mm")
        .regions
        .contains_key(region)
    {
        return Err(failed(
            stmt,
            format!("process '{proc}' already has a region '{region}'"),
        ));
    }
    let prot = vm_prot(s.prot.unwrap_or(Prot::ReadWrite));
    let flags = prot | calc_vm_flag_bits(s);
    let file = match &s.file {
        Some(name) => {
            let pgoff = s.offset.map_or(0, |o| o.bytes()) >> PAGE_SHIFT;
            let inode = crate::filemap::file_at_least(m, name);
            Some(FileVma {
                inode,
                pgoff,
                shared: false,
            })
        }
        // shmem_zero_setup: a shared anonymous mapping is of a shmem object
        // of its own.
        None if shared && s.hugetlb.is_none() => Some(FileVma {
            inode: crate::filemap::shmem_zero_setup(m),
            pgoff: 0,
            shared: true,
        }),
        None => None,
    };
    if let Some(at) = s.at {
        let len = size.bytes().next_multiple_of(PAGE_SIZE);
        let mapped = s.mapped_at_first(PAGE_SIZE);
        m.with_mm(id, |m, mm| {
            do_mmap_fixed(m, mm, region, at, len, mapped, flags, file)
        })
        .map_err(|Overlaps| {
            BackendError::errno(
                stmt,
                Errno::EEXIST,
                format!("mmap at={at:#x}: the range overlaps a mapping already there"),
            )
        })?;
        if s.growsdown {
            let mm = m.mms.get_mut(id).expect("a task's mm");
            mm.stack_regions
                .insert(region.clone(), hugelab_workload::mapped::Mapped::whole(len));
        }
        return Ok(());
    }
    let Some(hsize) = s.hugetlb else {
        let len = size.bytes().next_multiple_of(PAGE_SIZE);
        let align = align.map(|a| a.bytes().max(PAGE_SIZE));
        let mapped = s.mapped_at_first(PAGE_SIZE);
        let mm = m.mms.get_mut(id).expect("a task's mm");
        mm.do_mmap_top(region, len, mapped, align, flags, file);
        if s.growsdown {
            mm.stack_regions
                .insert(region.clone(), hugelab_workload::mapped::Mapped::whole(len));
        }
        return Ok(());
    };
    let bytes = hsize.bytes().bytes();
    let h = hugetlb::size_to_hstate(bytes).expect("2M or 1G");
    let len = size.bytes().next_multiple_of(bytes);
    if shared && !hugetlb::hstate_is_gigantic(h) && len >= PUD_SIZE {
        return Err(unsupported(
            stmt,
            "a shared hugetlb=2M mapping of 1G or more (PMD sharing)",
        ));
    }
    let align = align.map_or(bytes, |a| a.bytes().max(bytes));
    let hv = hugetlb::hugetlb_mmap(m, h, len, shared).map_err(|_| {
        BackendError::errno(
            stmt,
            Errno::ENOMEM,
            "mmap: the HugeTLB pool cannot reserve the mapping's pages",
        )
    })?;
    let mm = m.mms.get_mut(id).expect("a task's mm");
    mm.do_mmap_hugetlb(region, len, align, prot, hv);
    Ok(())
}

/// calc_vm_flag_bits (include/linux/mman.h) of the anonymous mmap flags
/// the language has: MAP_GROWSDOWN is VM_GROWSDOWN, and in Linux 6.18
/// MAP_STACK is VM_NOHUGEPAGE (glibc maps thread stacks with it).
fn calc_vm_flag_bits(s: &stmt::Mmap) -> u32 {
    let mut flags = 0;
    // accountable_mapping: private and writable (a HugeTLB mapping, which
    // takes its own path, is not).
    let writable = s.prot.unwrap_or(Prot::ReadWrite).write();
    if writable && !s.shared && s.hugetlb.is_none() {
        flags |= Vma::VM_ACCOUNT;
    }
    if s.growsdown {
        flags |= Vma::VM_GROWSDOWN;
    }
    if s.stack {
        flags |= Vma::VM_NOHUGEPAGE;
    }
    flags
}

/// stack_guard_gap (mm/mmap.c): 256 pages below a stack that no other
/// accessible mapping may reach into when the stack grows.
pub const STACK_GUARD_GAP: u64 = 256 * PAGE_SIZE;

/// RLIMIT_STACK's default (_STK_LIM, 8 MiB): the most a stack VMA grows to
/// (`acct_stack_growth`). The model takes the default; the kernel backend's
/// agents run with the limit of the shell that started hugelab.
pub const RLIMIT_STACK: u64 = 8 << 20;

/// expand_stack (mm/mmap.c, as x86's fault handler calls it through
/// `lock_mm_and_find_vma`) for a fault at `addr`, which no VMA contains:
/// the VMA above it, if VM_GROWSDOWN, grows down to `addr`'s page
/// (`expand_downwards`), unless that comes within `STACK_GUARD_GAP` of an
/// accessible VMA below that is not a stack itself, or makes the stack
/// larger than `RLIMIT_STACK`: then None, and the fault is SIGSEGV. The
/// grown VMA gets its anon_vma (`anon_vma_prepare`) and is re-linked in the
/// anon_vma tree at its new start.
pub fn expand_stack(m: &mut Machine, mm: &mut MmStruct, addr: u64) -> Option<Vma> {
    let vma = mm.vmas.range(addr..).next().map(|(_, v)| *v)?;
    if vma.flags & Vma::VM_GROWSDOWN == 0 {
        return None;
    }
    let address = addr & !(PAGE_SIZE - 1);
    if address < placement::MMAP_MIN_ADDR {
        return None;
    }
    let prev = mm.vmas.range(..vma.start).next_back().map(|(_, v)| *v);
    if let Some(p) = prev {
        let accessible = p.flags & Vma::PROT_MASK != 0;
        if p.flags & Vma::VM_GROWSDOWN == 0 && accessible && address - p.end < STACK_GUARD_GAP {
            return None;
        }
    }
    if vma.end - address > RLIMIT_STACK {
        return None;
    }
    mm.vmas.remove(&vma.start);
    m.anon_vmas.avc_unlink(mm.mm_id, vma.start);
    // The first page moves down, and with it vm_pgoff (expand_downwards:
    // `vma->vm_pgoff -= grow`).
    // expand_downwards runs anon_vma_prepare first.
    let anon_vma_id = if vma.anon_vma {
        vma.anon_vma_id
    } else {
        mm.anon_vmas_made += 1;
        mm.anon_vmas_made
    };
    let grown = Vma {
        start: address,
        pgoff: vma.pgoff - ((vma.start - address) >> PAGE_SHIFT),
        anon_vma: true,
        anon_vma_id,
        ..vma
    };
    mm.vmas.insert(address, grown);
    m.anon_vmas.avc_reinsert(mm.mm_id, address);
    Some(grown)
}

/// The `brk` statement (SYSCALL_DEFINE1(brk)): the first `brk` of a region
/// sets `start_brk` (its `at=`) and the break; each moves the break to
/// `start + size`. Shrinking unmaps the page-aligned tail
/// (`do_vmi_align_munmap`); growing fails with ENOMEM (the kernel returns
/// the old break, glibc's brk() says ENOMEM) when a VMA lies in the new
/// part or less than a page above it (`vm_start_gap`: a stack's guard gap
/// too), else `do_brk_flags` maps the new part.
pub fn sys_brk(m: &mut Machine, stmt: &Stmt, s: &stmt::Brk) -> Result<(), BackendError> {
    let id = mm_id_of(m, stmt, &s.proc)?;
    let mm = m.mms.get_mut(id).expect("a task's mm");
    let (start, old) = match (mm.regions.get(&s.region), s.at) {
        (Some(r), _) => (r.start, r.len),
        (None, Some(at)) => {
            let len = s.size.bytes().next_multiple_of(PAGE_SIZE);
            placement::after_fixed_region(&mut mm.mmap_cursor, at, len);
            (at, 0)
        }
        (None, None) => {
            return Err(failed(
                stmt,
                format!("process '{}' has no heap '{}'", s.proc, s.region),
            ))
        }
    };
    let new = s.size.bytes();
    let oldbrk = (start + old).next_multiple_of(PAGE_SIZE);
    let newbrk = (start + new).next_multiple_of(PAGE_SIZE);
    let moved = m.with_mm(id, |m, mm| {
        if newbrk < oldbrk {
            do_munmap(m, mm, newbrk, oldbrk).map_err(drop)
        } else if newbrk > oldbrk {
            do_brk_flags(m, mm, start, oldbrk, newbrk)
        } else {
            Ok(())
        }
    });
    let mm = m.mms.get_mut(id).expect("a task's mm");
    let len = if moved.is_ok() { new } else { old };
    mm.regions.insert(s.region.clone(), Region { start, len });
    moved.map_err(|()| {
        BackendError::errno(
            stmt,
            Errno::ENOMEM,
            format!(
                "brk: the heap cannot grow to {:#x}: a mapping is in the way (or within a page of it)",
                start + new
            ),
        )
    })
}

/// do_brk_flags (mm/vma.c, after brk's check of the next VMA): the heap
/// grows from `oldbrk` to `newbrk`. The brk VMA (the VMA ending at
/// `oldbrk`, if it ends above `start_brk`: `vma_prev_limit`) is expanded
/// when a new VMA could merge with it (`vma_merge_new_range` with
/// `just_expand`: equal flags and a mergeable anon_vma, never with the
/// next VMA), else a VMA of its own is made. Its flags are
/// VM_DATA_DEFAULT_FLAGS | VM_ACCOUNT, which in the model are an rw
/// mapping's.
fn do_brk_flags(
    m: &mut Machine,
    mm: &mut MmStruct,
    start_brk: u64,
    oldbrk: u64,
    newbrk: u64,
) -> Result<(), ()> {
    let next = mm
        .find_vma(oldbrk)
        .or_else(|| mm.vmas.range(oldbrk..).next().map(|(_, v)| *v));
    if let Some(n) = next {
        let gap = if n.flags & Vma::VM_GROWSDOWN != 0 {
            STACK_GUARD_GAP
        } else {
            0
        };
        if newbrk + PAGE_SIZE > n.start.saturating_sub(gap) {
            return Err(());
        }
    }
    let vma = Vma {
        start: oldbrk,
        end: newbrk,
        flags: Vma::VM_READ | Vma::VM_WRITE | Vma::VM_ACCOUNT,
        pgoff: oldbrk >> PAGE_SHIFT,
        anon_vma: false,
        anon_vma_id: 0,
        fork_child: false,
        hugetlb: None,
        file: None,
    };
    let brkvma = mm
        .vmas
        .range(..oldbrk)
        .next_back()
        .map(|(_, v)| *v)
        .filter(|p| p.end == oldbrk && p.end > start_brk);
    match brkvma {
        Some(p) if can_merge_new(&vma, &p) => {
            mm.vmas.insert(p.start, Vma { end: newbrk, ..p });
            m.anon_vmas.avc_reinsert(mm.mm_id, p.start);
        }
        _ => {
            mm.vmas.insert(oldbrk, vma);
        }
    }
    Ok(())
}

/// The `munmap` statement (SYSCALL_DEFINE2(munmap), `__vm_munmap`).
pub fn sys_munmap(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range(m, stmt, proc, range)?;
    if m.with_mm(id, |m, mm| do_munmap(m, mm, start, end)).is_err() {
        return Err(BackendError::errno(
            stmt,
            Errno::EINVAL,
            "munmap: the range cuts a HugeTLB mapping inside a huge page",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::Model;
    use hugelab_workload::{parse, run, Counters, Errno};

    const THP_ALWAYS: &str = "set transparent_hugepage/enabled always\n\
         set transparent_hugepage/hugepages-2048kB/enabled inherit\n";

    /// Runs `body` after THP `always`: the errno of the first failed call,
    /// the counters at the end, and the VMAs of process `a`.
    fn run_a(body: &str) -> (Option<Errno>, Counters, Vec<(u64, u64)>) {
        let w = parse("test.hlw", &format!("{THP_ALWAYS}spawn a\n{body}")).unwrap();
        let mut model = Model::default();
        let obs = run(&mut model, &w).unwrap();
        let failure = obs.failed_calls.first().map(|c| c.errno);
        let counters = obs
            .snapshots
            .last()
            .expect("the end snapshot")
            .counters
            .clone();
        let vmas = model.machine.mm_of("a").map_or(Vec::new(), |mm| {
            mm.vmas.values().map(|v| (v.start, v.end)).collect()
        });
        (failure, counters, vmas)
    }

    const LO: u64 = 0x7e00_0020_0000;

    #[test]
    fn adjacent_fixed_mmaps_merge_and_take_a_pmd_thp() {
        let (failure, c, vmas) = run_a(
            "a mmap lo 1M at=0x7e0000200000\n\
             a mmap hi 1M at=0x7e0000300000\n\
             a write lo\n",
        );
        assert_eq!(failure, None);
        assert_eq!(vmas, [(LO, LO + (2 << 20))]);
        // The first write faults a PMD THP over both regions; each region
        // reports the one VMA it lies in, the process counts it once.
        assert_eq!(c["smaps.a.lo.AnonHugePages"], 2048);
        assert_eq!(c["smaps.a.hi.AnonHugePages"], 2048);
        assert_eq!(c["smaps.a.AnonHugePages"], 2048);
        assert_eq!(c["stat.a.minflt"], 1);
    }

    #[test]
    fn different_prot_does_not_merge_nor_take_a_pmd_thp() {
        let (failure, c, vmas) = run_a(
            "a mmap lo 1M at=0x7e0000200000\n\
             a mmap hi 1M at=0x7e0000300000 prot=r\n\
             a write lo\n",
        );
        assert_eq!(failure, None);
        assert_eq!(
            vmas,
            [(LO, LO + (1 << 20)), (LO + (1 << 20), LO + (2 << 20))]
        );
        assert_eq!(c["smaps.a.AnonHugePages"], 0);
        assert_eq!(c["smaps.a.lo.Rss"], 1024);
        assert_eq!(c["smaps.a.hi.Rss"], 0);
    }

    #[test]
    fn a_fixed_mmap_merges_below_a_touched_region_and_fills_a_gap() {
        // Written first (it has an anon_vma), then a neighbour below: case 2
        // of is_mergeable_anon_vma, the new VMA takes the old one's anon_vma.
        let (failure, _, vmas) = run_a(
            "a mmap hi 1M at=0x7e0000300000\n\
             a write hi:4K\n\
             a mmap lo 1M at=0x7e0000200000\n",
        );
        assert_eq!(failure, None);
        assert_eq!(vmas, [(LO, LO + (2 << 20))]);
        // Three in a row: the middle one joins both untouched neighbours.
        let (_, _, vmas) = run_a(
            "a mmap lo 1M at=0x7e0000200000\n\
             a mmap hi 1M at=0x7e0000400000\n\
             a mmap mid 1M at=0x7e0000300000\n",
        );
        assert_eq!(vmas, [(LO, LO + (3 << 20))]);
        // Two touched neighbours: their anon_vmas differ, the gap joins prev.
        let (_, _, vmas) = run_a(
            "a mmap lo 1M at=0x7e0000200000 prot=r\n\
             a mmap hi 1M at=0x7e0000400000\n\
             a write hi:4K\n\
             a mprotect lo rw\n\
             a write lo:4K\n\
             a mmap mid 1M at=0x7e0000300000\n",
        );
        assert_eq!(
            vmas,
            [(LO, LO + (2 << 20)), (LO + (2 << 20), LO + (3 << 20))]
        );
    }

    #[test]
    fn a_forked_childs_touched_vma_takes_in_no_neighbour() {
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\n\
                 a mmap hi 1M at=0x7e0000300000\n\
                 a write hi:4K\n\
                 a fork b\n\
                 b mmap lo 1M at=0x7e0000200000\n\
                 a mmap lo 1M at=0x7e0000200000\n"
            ),
        )
        .unwrap();
        let mut model = Model::default();
        run(&mut model, &w).unwrap();
        let vmas = |p: &str| -> Vec<(u64, u64)> {
            let mm = model.machine.mm_of(p).unwrap();
            mm.vmas.values().map(|v| (v.start, v.end)).collect()
        };
        // vma_had_uncowed_parents: the child's copy links the parent's anon_vma.
        assert_eq!(
            vmas("b"),
            [(LO, LO + (1 << 20)), (LO + (1 << 20), LO + (2 << 20))]
        );
        assert_eq!(vmas("a"), [(LO, LO + (2 << 20))]);
    }

    #[test]
    fn mprotect_does_not_merge_a_fork_childs_vma_with_one_without_anon_vma() {
        // Parent: lo written (anon_vma), hi untouched, different prot; the
        // child's copies: lo a fork child, hi without anon_vma.
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\n\
                 a mmap lo 1M at=0x7e0000200000\n\
                 a mmap hi 1M at=0x7e0000300000 prot=r\n\
                 a write lo:4K\n\
                 a fork b\n\
                 b mprotect hi rw\n\
                 a mprotect hi rw\n"
            ),
        )
        .unwrap();
        let mut model = Model::default();
        run(&mut model, &w).unwrap();
        let vmas = |p: &str| model.machine.mm_of(p).unwrap().vmas.len();
        assert_eq!(vmas("b"), 2, "case 1/2 with a fork child: no merge");
        assert_eq!(vmas("a"), 1);
    }

    #[test]
    fn an_overlapping_fixed_mmap_is_eexist_and_placement_keeps_clear() {
        let (failure, c, _) = run_a(
            "a mmap lo 2M at=0x7e0000200000\n\
             a mmap hi 1M at=0x7e0000300000\n",
        );
        assert_eq!(failure, Some(Errno::EEXIST));
        assert!(!c.contains_key("smaps.a.hi.Rss"), "no region after EEXIST");
        // A region placed by the rule after a fixed one lands past it.
        let (failure, _, vmas) = run_a(
            "a mmap fixed 2M at=0x7e0000200000\n\
             a mmap placed 2M\n",
        );
        assert_eq!(failure, None);
        assert_eq!(vmas.len(), 2);
        assert!(vmas[1].0 >= LO + (4 << 20), "{vmas:x?}");
    }

    /// The VMAs of process `a` after `body` (THP settings as `run_a`), or
    /// the error that stopped the run.
    fn vmas_after(body: &str) -> Result<Vec<(u64, u64)>, String> {
        let w = parse("test.hlw", &format!("{THP_ALWAYS}spawn a\n{body}")).unwrap();
        let mut model = Model::default();
        run(&mut model, &w).map_err(|e| e.to_string())?;
        let mm = model.machine.mm_of("a").unwrap();
        Ok(mm.vmas.values().map(|v| (v.start, v.end)).collect())
    }

    /// x86 protection keys: PROT_EXEC alone is execute-only (a read is
    /// SIGSEGV) until mprotect gives another protection; without them an
    /// exec-only VMA is readable (access_error's vma_is_accessible).
    #[test]
    fn an_exec_only_mapping_is_unreadable_with_protection_keys_only() {
        let read_x = |pkeys: &str, prot_after: &str| {
            let text = format!(
                "machine pkeys={pkeys}\nspawn a\na mmap x 64K prot=x\n{prot_after}a read x:4K\n"
            );
            let w = parse("test.hlw", &text).unwrap();
            run(&mut Model::default(), &w)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(read_x("off", ""), Ok(()));
        let e = read_x("on", "").unwrap_err();
        assert!(e.contains("SIGSEGV"), "{e}");
        assert_eq!(read_x("on", "a mprotect x rx\n"), Ok(()));
        let e = read_x("on", "a mprotect x rx\na mprotect x x\n").unwrap_err();
        assert!(e.contains("SIGSEGV"), "{e}");
    }

    #[test]
    fn a_growsdown_stack_maps_its_top_and_grows_on_a_fault_below() {
        let top = LO + (1 << 20);
        let vmas = vmas_after("a mmap stk 1M at=0x7e0000200000 growsdown initial=64K\n").unwrap();
        assert_eq!(vmas, [(top - (64 << 10), top)]);
        let vmas = vmas_after(
            "a mmap stk 1M at=0x7e0000200000 growsdown\n\
             a write stk+516K:1\n",
        )
        .unwrap();
        assert_eq!(
            vmas,
            [(LO + (516 << 10), top)],
            "grown to the faulting page"
        );
        // The region it grows into must be free: EEXIST, as the kernel backend says.
        let (failure, _, _) = run_a(
            "a mmap lo 4K at=0x7e0000200000\n\
             a mmap stk 1M at=0x7e0000200000 growsdown\n",
        );
        assert_eq!(failure, Some(Errno::EEXIST));
    }

    #[test]
    fn a_stack_region_is_gone_when_munmaps_covered_all_of_it() {
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\n\
                 a mmap stk 1M at=0x7e0000200000 growsdown initial=64K\n\
                 a munmap stk+960K\n"
            ),
        )
        .unwrap();
        let mut model = Model::default();
        run(&mut model, &w).unwrap();
        let mm = model.machine.mm_of("a").unwrap();
        assert!(mm.vmas.is_empty());
        assert!(
            mm.regions.contains_key("stk"),
            "the part below still counts"
        );
        let w = parse(
            "t.hlw",
            &format!(
                "{THP_ALWAYS}spawn a\n\
                 a mmap stk 1M at=0x7e0000200000 growsdown initial=64K\n\
                 a munmap stk+960K\n\
                 a munmap stk:960K\n\
                 a mmap stk 4K\n"
            ),
        )
        .unwrap();
        let mut model = Model::default();
        run(&mut model, &w).unwrap();
        assert_eq!(model.machine.mm_of("a").unwrap().vmas.len(), 1);
    }

    #[test]
    fn a_stack_does_not_grow_within_the_guard_gap_of_a_mapping_below() {
        // lo ends 512K below the stack's bottom: less than stack_guard_gap.
        let e = vmas_after(
            "a mmap lo 64K at=0x7e0000100000\n\
             a mmap stk 1M at=0x7e0000190000 growsdown\n\
             a write stk\n",
        )
        .unwrap_err();
        assert!(e.contains("SIGSEGV"), "{e}");
        // A prot=none neighbour is not accessible: no gap needed.
        let vmas = vmas_after(
            "a mmap lo 64K at=0x7e0000100000 prot=none\n\
             a mmap stk 1M at=0x7e0000190000 growsdown\n\
             a write stk\n",
        )
        .unwrap();
        assert_eq!(vmas.len(), 2);
    }

    #[test]
    fn a_stack_mapping_is_nohugepage_and_merges_with_no_plain_neighbour() {
        let (_, c, vmas) = run_a(
            "a mmap s 2M at=0x7e0000200000 stack\n\
             a mmap p 2M at=0x7e0000400000\n\
             a write s\n",
        );
        assert_eq!(vmas.len(), 2);
        assert_eq!(c["smaps.a.s.AnonHugePages"], 0);
        assert_eq!(c["stat.a.minflt"], 512);
    }

    #[test]
    fn brk_expands_its_vma_and_unmaps_the_tail() {
        let base = 0x7e00_0010_0000;
        let vmas = vmas_after(
            "a brk heap 0 at=0x7e0000100000\n\
             a brk heap 1M\n\
             a write heap:4K\n\
             a brk heap 3M\n",
        )
        .unwrap();
        assert_eq!(vmas, [(base, base + (3 << 20))], "one VMA, expanded");
        let vmas = vmas_after(
            "a brk heap 1M at=0x7e0000100000\n\
             a brk heap 4097\n",
        )
        .unwrap();
        assert_eq!(
            vmas,
            [(base, base + (8 << 10))],
            "the break rounded up to a page"
        );
        // brk never merges with a VMA below start_brk, unlike an mmap.
        let vmas = vmas_after(
            "a mmap below 1M at=0x7e0000000000\n\
             a brk heap 1M at=0x7e0000100000\n",
        )
        .unwrap();
        assert_eq!(vmas.len(), 2);
    }

    #[test]
    fn brk_cannot_grow_into_or_next_to_a_mapping() {
        let (failure, c, _) = run_a(
            "a mmap wall 64K at=0x7e0000300000\n\
             a brk heap 1M at=0x7e0000100000\n\
             a brk heap 2M\n\
             expect errno == ENOMEM\n\
             a brk heap 2044K\n\
             expect errno == ENOMEM\n\
             a brk heap 2040K\n\
             a write heap:1M\n",
        );
        assert_eq!(failure, Some(Errno::ENOMEM));
        assert_eq!(c["smaps.a.heap.Rss"], 1024);
    }

    #[test]
    fn populate_stops_at_a_hole_with_enomem_and_keeps_what_it_did() {
        let (failure, c, _) = run_a(
            "a mmap r 4M\n\
             a munmap r+2M:4K\n\
             a madvise r POPULATE_WRITE\n",
        );
        assert_eq!(failure, Some(Errno::ENOMEM));
        assert_eq!(c["vmstat.thp_fault_alloc"], 1);
        assert_eq!(c["stat.a.minflt"], 1);
    }
}
