//! Address spaces: `mm_struct`, VMAs, mmap/munmap, VMA split and merge.
//!
//! Follows Linux 6.18 `mm/mmap.c` and `mm/vma.c` (`__split_vma`,
//! `vma_merge_existing_range`, `do_vmi_munmap`, `free_pgtables`, `exit_mmap`)
//! and `vma_adjust_trans_huge` from `mm/huge_memory.c`, which splits a PMD
//! mapping that a new VMA boundary would cut.
//!
//! Simplifications: anonymous private mappings and HugeTLB mappings
//! (`hugetlb`) only; a VMA records only
//! whether it has an anon_vma — the anon_vma itself is one per mm
//! (`rmap::AnonVmas`), so two neighbouring VMAs of one region merge when
//! their flags match, which is when the kernel merges them too, as they share
//! the region's anon_vma; regions are
//! placed by hugelab's own rule (below) rather than by the kernel's top-down
//! search, so that both backends place them the same way.
//!
//! Placement: `hugelab_workload::placement`, the rule both backends share,
//! so a region has the same address (and page-table shape) on both.
//!
//! Page tables: PTE tables, and the PMD and PUD tables above them, are
//! allocated at fault and freed by free_pgtables when no VMA is left in
//! their range, as `free_pgd_range` does with the floor and ceiling of the
//! neighbouring VMAs. The P4D and PGD levels are shared with the process's
//! own mappings and never change.

use crate::hugetlb;
use crate::memory_zap::zap_page_range;
use crate::mm_types::{HugetlbVma, MmStruct, Region, Vma, PAGE_SIZE, PMD_SIZE, PUD_SIZE};
use crate::pgtable::Pmd;
use crate::syscall::{failed, mm_id_of, resolve_range, unsupported, vm_prot};
use crate::Machine;
use hugelab_workload::{placement, stmt, BackendError, Errno, Prot, Range, Stmt};

impl MmStruct {
    /// do_mmap of an anonymous private region; returns its start address.
    pub fn do_mmap(&mut self, name: &str, len: u64, align: Option<u64>, prot: u32) -> u64 {
        let align = align.unwrap_or(placement::default_align(len));
        self.map_region(name, len, align, prot, None)
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
        self.map_region(name, len, align, prot, Some(hv))
    }

    /// A new region in a VMA of its own, placed by hugelab's rule.
    fn map_region(
        &mut self,
        name: &str,
        len: u64,
        align: u64,
        prot: u32,
        hugetlb: Option<HugetlbVma>,
    ) -> u64 {
        let start = placement::place_region(&mut self.mmap_cursor, len, align);
        self.vmas.insert(
            start,
            Vma {
                start,
                end: start + len,
                flags: prot,
                anon_vma: false,
                hugetlb,
            },
        );
        self.regions.insert(name.to_string(), Region { start, len });
        start
    }
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
    mm.vmas.insert(addr, Vma { start: addr, ..vma });
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
            // VM_HUGETLB VMAs never merge (VM_DONTEXPAND is VM_SPECIAL).
            Some(p)
                if p.end == vma.start
                    && p.flags == vma.flags
                    && p.hugetlb.is_none()
                    && vma.hugetlb.is_none() =>
            {
                mm.vmas.remove(&key);
                let merged = Vma {
                    end: vma.end,
                    anon_vma: p.anon_vma || vma.anon_vma,
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
    split_vma(m, mm, start);
    split_vma(m, mm, end);
    let mut covered = start;
    for vma in mm.vmas_in(start, end) {
        covered = if vma.start <= covered {
            vma.end
        } else {
            covered
        };
        let flags = update(vma.flags);
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
}

/// free_pgtables: frees the page tables of PMD slots around `[start, end)` that
/// no VMA overlaps any more.
fn free_pgtables(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64) {
    let first = start / PMD_SIZE;
    let last = (end - 1) / PMD_SIZE;
    for index in first..=last {
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
        for index in start / size..=(end - 1) / size {
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
/// `MAP_SHARED`) whose pages the pool reserves at once.
pub fn sys_mmap(m: &mut Machine, stmt: &Stmt, s: &stmt::Mmap) -> Result<(), BackendError> {
    let (proc, region, size, align, shared) = (&s.proc, &s.region, s.size, s.align, s.shared);
    if shared && s.hugetlb.is_none() {
        return Err(unsupported(stmt, "mmap shared without hugetlb="));
    }
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
    let Some(hsize) = s.hugetlb else {
        let len = size.bytes().next_multiple_of(PAGE_SIZE);
        let align = align.map(|a| a.bytes().max(PAGE_SIZE));
        m.mms
            .get_mut(id)
            .expect("a task's mm")
            .do_mmap(region, len, align, prot);
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
