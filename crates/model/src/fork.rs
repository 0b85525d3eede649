//! fork: duplicating an address space for a child process.
//!
//! Follows Linux 6.18 `mm/mmap.c` (`dup_mmap`, which moved there from
//! `kernel/fork.c` in 6.16, and the `khugepaged_fork` it calls) and
//! `mm/memory.c` (`copy_page_range` down to `copy_pte_range`,
//! `copy_present_ptes`, `copy_present_page`), with `copy_huge_pmd` from
//! `mm/huge_memory.c`:
//! - only VMAs with an anon_vma have their page tables copied (`vma_needs_copy`):
//!   a VMA that never took a write or PMD fault is faulted afresh by the child;
//! - a PMD-mapped THP stays PMD-mapped in both, a PTE-mapped folio stays
//!   PTE-mapped, both write-protected and no longer PageAnonExclusive, with
//!   one reference and one mapcount more per mapping;
//! - a page cache page of a private file VMA with an anon_vma is mapped in
//!   the child too, read-only as in the parent (folio_dup_file_rmap_ptes);
//! - a private HugeTLB mapping's pages are shared write-protected
//!   (`hugetlb::copy_hugetlb_page_range`); the child owns no reservation;
//! - when the parent has ever pinned (MMF_HAS_PINNED) and a folio may be
//!   pinned, its exclusive pages are copied for the child at once
//!   (`copy_present_page`) instead of being shared, after splitting a PMD.
//!
//! Simplifications: the child's PUD and PMD tables are allocated for every
//! 1 GiB / 512 GiB range where the parent has one and a copied VMA lies, as
//! `pud_alloc`/`pmd_alloc` in `copy_p4d_range`/`copy_pud_range` do; PTE
//! batches come from `folio_pte_batch` (see `internal`) for every folio,
//! where `copy_present_ptes` batches only a large folio it does not expect
//! to copy: when the batch cannot be shared (a maybe-pinned folio, -EAGAIN)
//! the model goes on page by page at once, as the kernel's retry with a
//! preallocated page does.

use crate::huge_memory::{copy_huge_pmd, PmdFault};
use crate::internal::folio_pte_batch;
use crate::mm_types::{pg, Fault, MmId, MmStruct, Pfn, Vma, PMD_SIZE, PUD_SIZE};
use crate::mmap::exit_mmap;
use crate::page_alloc::alloc_folio;
use crate::pgtable::{pte_index, Pmd, Pte, PteTable};
use crate::rmap;
use crate::sparse::page_folio;
use crate::syscall::{failed, mm_id_of_ranged};
use crate::{hugetlb, Machine, Model, Task};
use hugelab_workload::{BackendError, Stmt};

/// dup_mmap: `dst` (a new, empty mm with its own id) becomes a copy of `src`.
pub fn dup_mmap(m: &mut Machine, src: &mut MmStruct, dst: &mut MmStruct) -> Result<(), Fault> {
    // anon_vma_fork: the child's anon_vma hangs under the parent's, so an
    // rmap walk of the parent's folios finds the child's mappings too.
    if m.injected_bug == Some(crate::InjectedBug::ForkSkipsAnonVmaLink) {
        m.anon_vmas.alloc(dst.mm_id);
    } else {
        m.anon_vmas.fork(src.mm_id, dst.mm_id);
    }
    dst.vmas = src.vmas.clone();
    crate::special_mapping::dup_special_ptes(src, dst);
    // hugetlb_dup_vma_private and hugetlb_vm_op_open for the child's
    // HugeTLB VMAs: the file is shared, reservations stay the parent's.
    for vma in dst.vmas.values_mut() {
        // anon_vma_fork links the child's VMA to the parent's anon_vma,
        // and gives it an anon_vma of its own.
        vma.fork_child |= vma.anon_vma;
        if vma.anon_vma {
            dst.anon_vmas_made += 1;
            vma.anon_vma_id = dst.anon_vmas_made;
        }
        if let Some(hv) = vma.hugetlb {
            let child = hugetlb::hugetlb_dup_vma_private(hv);
            hugetlb::hugetlb_vm_op_open(m, &child);
            vma.hugetlb = Some(child);
        }
    }
    dst.regions = src.regions.clone();
    dst.stack_regions = src.stack_regions.clone();
    dst.mmap_cursor = src.mmap_cursor;
    // MMF_INIT_MASK carries PR_SET_THP_DISABLE; khugepaged_fork registers
    // the child when the parent is registered.
    dst.thp_disabled = src.thp_disabled;
    dst.khugepaged_registered = src.khugepaged_registered;
    let vmas: Vec<Vma> = src.vmas.values().copied().collect();
    for vma in vmas.iter().filter(|v| v.anon_vma) {
        if vma.hugetlb.is_some() {
            hugetlb::copy_hugetlb_page_range(m, dst, src, vma)?;
        } else {
            copy_page_range(m, dst, src, vma)?;
        }
    }
    Ok(())
}

/// copy_page_range for one VMA.
fn copy_page_range(
    m: &mut Machine,
    dst: &mut MmStruct,
    src: &mut MmStruct,
    vma: &Vma,
) -> Result<(), Fault> {
    // pud_alloc / pmd_alloc where the parent has the table.
    for size in [PUD_SIZE << 9, PUD_SIZE] {
        for index in vma.start / size..=(vma.end - 1) / size {
            let (src_tables, dst_tables) = if size == PUD_SIZE {
                (&src.pmd_tables, &mut dst.pmd_tables)
            } else {
                (&src.pud_tables, &mut dst.pud_tables)
            };
            if src_tables.contains_key(&index) && !dst_tables.contains_key(&index) {
                let pfn = m.pte_alloc_one()?;
                dst_tables.insert(index, pfn);
            }
        }
    }
    let first = vma.start / PMD_SIZE;
    let last = (vma.end - 1) / PMD_SIZE;
    let indexes: Vec<u64> = src.pmds.range(first..=last).map(|(i, _)| i).collect();
    for index in indexes {
        if matches!(
            src.pmds.get(&index),
            Some(Pmd::Huge { .. } | Pmd::HugeZero { .. })
        ) {
            // A huge PMD lies wholly inside the VMA (a VMA edge splits it).
            if let PmdFault::Done = copy_huge_pmd(m, dst, src, index)? {
                continue;
            }
        }
        let lo = vma.start.max(index * PMD_SIZE);
        let hi = vma.end.min((index + 1) * PMD_SIZE);
        copy_pte_range(m, dst, src, vma, index, lo, hi)?;
    }
    Ok(())
}

/// copy_pte_range: `[lo, hi)` of the PTE table at `index`, a folio batch
/// at a time (copy_present_ptes), with no allocation but the child's table.
fn copy_pte_range(
    m: &mut Machine,
    dst: &mut MmStruct,
    src: &mut MmStruct,
    vma: &Vma,
    index: u64,
    lo: u64,
    hi: u64,
) -> Result<(), Fault> {
    if !dst.pmds.contains_key(&index) {
        let page = m.pte_alloc_one()?;
        dst.pmds.insert(index, Pmd::Table(PteTable::new(page)));
    }
    let (src_id, dst_id, has_pinned) = (src.mm_id, dst.mm_id, src.has_pinned);
    let Some(Pmd::Table(st)) = src.pmds.get_mut(&index) else {
        unreachable!("copy_pte_range without a source table");
    };
    let Some(Pmd::Table(dt)) = dst.pmds.get_mut(&index) else {
        unreachable!("copy_pte_range without a destination table");
    };
    // The child's PTEs keep the parent's dirty bits (a clean one after MADV_FREE).
    dt.dirty = st.dirty;
    let writable = vma.flags & Vma::VM_WRITE != 0;
    let (mut i, end) = (pte_index(lo), pte_index(hi - 1) + 1);
    let mut rss = 0u64;
    while i < end {
        let pte = st.ptes[i];
        let Some(page) = pte.pfn() else {
            // pte_none, or the zero page (not a normal page): copied as is.
            dt.ptes[i] = pte;
            i += 1;
            continue;
        };
        // A small folio nobody may have pinned (the fork hot path):
        // folio_try_dup_anon_rmap_pte and __copy_present_ptes inline.
        let p = m.zone.memmap.page_mut(page);
        if !p.test(pg::ANON) {
            // A page cache page of a private file VMA (folio_dup_file_rmap_pte):
            // mapped read-only, as it is in the parent; not anon rss.
            p.mapcount += 1;
            p.private += 1;
            dt.ptes[i] = pte;
            i += 1;
            continue;
        }
        if p.is_small_folio() && (!has_pinned || p.private < rmap::GUP_PIN_COUNTING_BIAS) {
            p.clear(pg::ANON_EXCLUSIVE);
            p.mapcount += 1;
            p.private += 1;
            let shared = pte.wrprotect();
            st.ptes[i] = shared;
            dt.ptes[i] = shared;
            rss += 1;
            i += 1;
            continue;
        }
        let folio = page_folio(m, page);
        let nr = folio_pte_batch(m, folio, &st.ptes[i..], end - i);
        let maybe_pinned = has_pinned && rmap::folio_maybe_dma_pinned(m, folio);
        rss += nr as u64;
        if rmap::folio_try_dup_anon_rmap_ptes(
            m,
            folio,
            page,
            nr as u64,
            dst_id,
            src_id,
            maybe_pinned,
        )
        .is_ok()
        {
            share_ptes(st, dt, i, nr);
            i += nr;
            continue;
        }
        // -EAGAIN: page by page, copying the exclusive (maybe pinned) ones.
        for k in 0..nr {
            let page = Pfn(page.0 + k as u64);
            if rmap::folio_try_dup_anon_rmap_ptes(m, folio, page, 1, dst_id, src_id, maybe_pinned)
                .is_ok()
            {
                share_ptes(st, dt, i + k, 1);
            } else {
                copy_present_page(m, dt, dst_id, i + k, page, writable)?;
            }
        }
        i += nr;
    }
    m.stat.add_mm_anon(&mut dst.anon_rss, rss);
    Ok(())
}

/// __copy_present_ptes for a COW mapping: both sides write-protected.
///
/// Not named __copy_present_ptes: only that function's COW case is here.
#[inline]
fn share_ptes(st: &mut PteTable, dt: &mut PteTable, i: usize, nr: usize) {
    for k in i..i + nr {
        let pte = st.ptes[k].wrprotect();
        st.ptes[k] = pte;
        dt.ptes[k] = pte;
    }
}

/// copy_present_page: the child gets its own copy of a page the parent may
/// have pinned, mapped writable (when the VMA is); the parent keeps its page.
fn copy_present_page(
    m: &mut Machine,
    dt: &mut PteTable,
    dst_id: MmId,
    i: usize,
    page: Pfn,
    writable: bool,
) -> Result<(), Fault> {
    let new = alloc_folio(m, 0).ok_or(Fault::Oom)?;
    // folio_prealloc for the child (its memcg is the parent's).
    let gfp = crate::gfp::Gfp::HIGHUSER_MOVABLE;
    if crate::memcontrol_charge::mem_cgroup_charge(m, None, dst_id, new, 0, gfp).is_err() {
        crate::page_alloc::free_folio(m, new);
        return Err(Fault::Oom);
    }
    crate::thp_utilization::copy_content(m, page, new);
    rmap::folio_add_new_anon_rmap(m, new, 0, false, dst_id, 0);
    dt.ptes[i] = Pte::new(new, writable);
    dt.pte_mkdirty(i);
    Ok(())
}

/// The `fork` statement (kernel/fork.c `kernel_clone` without CLONE_VM,
/// `copy_mm` -> `dup_mm`): a child with a copy of `parent`'s address space,
/// in its memory cgroup, holding the io_uring rings it holds.
pub fn sys_fork(
    model: &mut Model,
    stmt: &Stmt,
    parent: &str,
    child: &str,
) -> Result<(), BackendError> {
    let m = &mut model.machine;
    if m.tasks.contains_key(child) {
        return Err(failed(stmt, format!("process '{child}' already exists")));
    }
    let src_id = mm_id_of_ranged(m, stmt, parent)?;
    let dst_id = m.mms.alloc();
    // The child is in its parent's memory cgroup.
    if let Some(memcg) = m.memcg.mm_memcg(src_id) {
        m.memcg.attach(dst_id, memcg);
    }
    let mut dst = m.mms.take(dst_id);
    let copied = m.with_mm(src_id, |m, src| dup_mmap(m, src, &mut dst));
    if copied.is_err() {
        // The kernel undoes a half-made child (dup_mmap's failure path,
        // then mmput): so does the model, and then refuses to go on,
        // where the kernel would have run its OOM killer.
        exit_mmap(m, &mut dst);
        m.anon_vmas.exit(dst_id);
        m.memcg.detach(dst_id);
        m.mms.free(dst_id);
        return Err(failed(stmt, "fork failed: no memory for the child"));
    }
    m.mms.put(dst);
    let task = Task::leader(dst_id);
    m.tasks.insert(child.to_string(), task);
    for pin in model.pins.iter_mut() {
        if pin.holders.iter().any(|h| h == parent) {
            pin.holders.push(child.to_string());
        }
    }
    Ok(())
}
