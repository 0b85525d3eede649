//! mprotect.
//!
//! Follows Linux 6.18 `mm/mprotect.c` (`mprotect_fixup`, `change_protection`):
//! VMAs are split at the range's edges (splitting a PMD THP that an edge cuts)
//! and merged again afterwards; removing write permission write-protects every
//! PTE and PMD; granting it makes exclusive anonymous pages writable at once
//! (MM_CP_TRY_CHANGE_WRITABLE with `can_change_pte_writable`), so no write fault follows.

use crate::mm_types::{pg, MmStruct, Vma, PMD_SIZE, PTRS_PER_PTE};
use crate::mmap::update_vmas;
use crate::pgtable::Pmd;
use crate::syscall::{resolve_range_no_hugetlb, vm_prot};
use crate::Machine;
use hugelab_workload::{BackendError, Errno, Prot, Range, Stmt};

/// The `mprotect` statement (SYSCALL_DEFINE3(mprotect), `do_mprotect_pkey`).
pub fn sys_mprotect(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    range: &Range,
    prot: Prot,
) -> Result<(), BackendError> {
    let (id, start, end) = resolve_range_no_hugetlb(m, stmt, proc, range)?;
    // A shared mapping's PTEs follow vm_page_prot (and the dirty bit, for
    // write upgrades): not modelled.
    let mm = m.mms.get(id).expect("a task's mm exists");
    if mm
        .vmas_in(start, end)
        .iter()
        .any(|v| v.file.is_some_and(|f| f.shared))
    {
        return Err(crate::syscall::unsupported(
            stmt,
            "mprotect of a shared anonymous region",
        ));
    }
    if !m.with_mm(id, |m, mm| do_mprotect(m, mm, start, end, vm_prot(prot))) {
        return Err(BackendError::errno(
            stmt,
            Errno::ENOMEM,
            "mprotect: part of the range is not mapped",
        ));
    }
    Ok(())
}

/// Changes the protection of `[start, end)`; false if part of it is unmapped (ENOMEM).
///
/// Named for do_mprotect_pkey, without the protection key.
pub fn do_mprotect(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64, prot: u32) -> bool {
    let covered = update_vmas(m, mm, start, end, |vma| mprotect_flags(vma, prot));
    change_protection(m, mm, start, end, prot & Vma::VM_WRITE != 0);
    covered
}

/// mprotect_fixup's new flags: the protection, and VM_ACCOUNT gained by a
/// private mapping made writable, lost when made read-only only by an
/// anonymous VMA with no anon_vma yet (a commit charge is not given back
/// once pages may have been written).
fn mprotect_flags(vma: &Vma, prot: u32) -> u32 {
    let mut flags = (vma.flags & !Vma::PROT_MASK) | prot;
    let shared = vma.file.is_some_and(|f| f.shared);
    if prot & Vma::VM_WRITE != 0 {
        if !shared && vma.hugetlb.is_none() {
            flags |= Vma::VM_ACCOUNT;
        }
    } else if vma.file.is_none() && !vma.anon_vma {
        flags &= !Vma::VM_ACCOUNT;
    }
    flags
}

fn change_protection(m: &mut Machine, mm: &mut MmStruct, start: u64, end: u64, write: bool) {
    let first = start / PMD_SIZE;
    let last = (end - 1) / PMD_SIZE;
    for (index, pmd) in mm.pmds.range_mut(first..=last) {
        match pmd {
            Pmd::Huge { pfn, writable, .. } => {
                *writable = write && m.zone.memmap.page(*pfn).test(pg::ANON_EXCLUSIVE);
            }
            Pmd::HugeZero { .. } => {}
            Pmd::Table(t) => {
                let lo = start.max(index * PMD_SIZE);
                let hi = end.min((index + 1) * PMD_SIZE);
                let from = ((lo / crate::mm_types::PAGE_SIZE) as usize) % PTRS_PER_PTE;
                let to = from + ((hi - lo) / crate::mm_types::PAGE_SIZE) as usize;
                for pte in &mut t.ptes[from..to] {
                    let Some(pfn) = pte.pfn() else { continue };
                    *pte = if write && m.zone.memmap.page(pfn).test(pg::ANON_EXCLUSIVE) {
                        pte.mkwrite()
                    } else {
                        pte.wrprotect()
                    };
                }
            }
        }
    }
}
