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
use crate::mm_types::{page_folio, Fault, Pfn, PMD_SIZE, PUD_SIZE};
use crate::mmap::{MmStruct, Vma};
use crate::page_alloc::alloc_folio;
use crate::pgtable::{pte_index, Pmd, Pte, PteTable};
use crate::rmap;
use crate::Machine;

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
    dst.regions = src.regions.clone();
    dst.mmap_cursor = src.mmap_cursor;
    // MMF_INIT_MASK carries PR_SET_THP_DISABLE; khugepaged_fork registers
    // the child when the parent is registered.
    dst.thp_disabled = src.thp_disabled;
    dst.khugepaged_registered = src.khugepaged_registered;
    let vmas: Vec<Vma> = src.vmas.values().copied().collect();
    for vma in vmas.iter().filter(|v| v.anon_vma) {
        copy_page_range(m, dst, src, vma)?;
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

/// copy_pte_range: `[lo, hi)` of the PTE table at `index`.
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
    let (mut i, end) = (pte_index(lo), pte_index(hi - 1) + 1);
    while i < end {
        let Some(Pmd::Table(st)) = src.pmds.get(&index) else {
            unreachable!("copy_pte_range without a source table");
        };
        let pte = st.ptes[i];
        let Some(page) = pte.pfn() else {
            // pte_none, or the zero page (not a normal page): copied as is.
            set_pte(dst, index, i, pte);
            i += 1;
            continue;
        };
        let folio = page_folio(m, page);
        let nr = folio_pte_batch(m, folio, &st.ptes[i..], end - i);
        let maybe_pinned = src.has_pinned && rmap::folio_maybe_dma_pinned(m, folio);
        let (src_id, dst_id) = (src.mm_id, dst.mm_id);
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
            share_ptes(dst, src, index, i, nr);
            dst.anon_rss += nr as u64;
            i += nr;
            continue;
        }
        // -EAGAIN: page by page, copying the exclusive (maybe pinned) ones.
        for k in 0..nr {
            let page = Pfn(page.0 + k as u64);
            if rmap::folio_try_dup_anon_rmap_ptes(m, folio, page, 1, dst_id, src_id, maybe_pinned)
                .is_ok()
            {
                share_ptes(dst, src, index, i + k, 1);
            } else {
                copy_present_page(m, dst, vma, index, i + k, page)?;
            }
            dst.anon_rss += 1;
        }
        i += nr;
    }
    Ok(())
}

fn set_pte(mm: &mut MmStruct, index: u64, i: usize, pte: Pte) {
    match mm.pmds.get_mut(&index) {
        Some(Pmd::Table(t)) => t.ptes[i] = pte,
        _ => unreachable!("no PTE table to copy into"),
    }
}

/// __copy_present_ptes for a COW mapping: both sides write-protected.
fn share_ptes(dst: &mut MmStruct, src: &mut MmStruct, index: u64, i: usize, nr: usize) {
    let Some(Pmd::Table(st)) = src.pmds.get_mut(&index) else {
        unreachable!("no source table");
    };
    for k in i..i + nr {
        st.ptes[k] = st.ptes[k].wrprotect();
    }
    let ptes: Vec<Pte> = st.ptes[i..i + nr].to_vec();
    for (k, pte) in ptes.into_iter().enumerate() {
        set_pte(dst, index, i + k, pte);
    }
}

/// copy_present_page: the child gets its own copy of a page the parent may
/// have pinned, mapped writable (when the VMA is); the parent keeps its page.
fn copy_present_page(
    m: &mut Machine,
    dst: &mut MmStruct,
    vma: &Vma,
    index: u64,
    i: usize,
    page: Pfn,
) -> Result<(), Fault> {
    let new = alloc_folio(m, 0).ok_or(Fault::Oom)?;
    crate::thp_utilization::copy_content(m, page, new);
    rmap::folio_add_new_anon_rmap(m, new, 0, false, dst.mm_id, 0);
    set_pte(dst, index, i, Pte::new(new, vma.flags & Vma::VM_WRITE != 0));
    Ok(())
}
