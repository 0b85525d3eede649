//! Helpers several mm/ files share, from Linux 6.18 `mm/internal.h`.
//!
//! Only what the model needs so far: `folio_pte_batch` (declared there,
//! defined in `mm/util.c` on top of the inline `folio_pte_batch_flags`), which
//! fork (`copy_present_ptes`) and zap (`zap_present_ptes`) use to handle the
//! PTEs of one folio in one go.

use crate::mm_types::Pfn;
use crate::pgtable::Pte;
use crate::Machine;

/// folio_pte_batch: how many PTEs, from `ptes[0]` on, form a PTE batch of
/// `folio`: consecutive present PTEs that map consecutive pages of the folio,
/// in one page table and one VMA. At least 1, at most `max_nr`.
///
/// `ptes[0]` must map a page of `folio` (a normal page: not the zero page).
/// `max_nr` must be at least 1 and is the caller's limit, which must keep the
/// batch inside one VMA and one page table (so at most `ptes.len()`); it is
/// clamped further to the folio's pages from the first PTE's page on, so a
/// batch never leaves the folio. A PTE continues the batch when it maps the
/// page after the previous one; the kernel also wants every other PTE bit
/// equal except accessed, writable, dirty and soft-dirty, and a model PTE has
/// no bit but its pfn and writable, so the pfn alone decides.
///
/// Simplifications: no `fpb_t` flags (`folio_pte_batch_flags`): fork's
/// FPB_RESPECT_DIRTY / FPB_RESPECT_SOFT_DIRTY compare bits the model does not
/// keep, and FPB_MERGE_WRITE only matters to a copy that fork write-protects
/// anyway; no `pte_batch_hint` (no contiguous-PTE hardware); the kernel reads
/// a copy of the first entry the caller passes, the model reads `ptes[0]`
/// (nothing changes it concurrently). The kernel calls it only for a large
/// folio (a small one is a batch of one); the model may pass a small folio,
/// for which the clamp gives 1.
#[inline]
pub fn folio_pte_batch(m: &Machine, folio: Pfn, ptes: &[Pte], max_nr: usize) -> usize {
    debug_assert!(max_nr >= 1 && max_nr <= ptes.len(), "max_nr {max_nr}");
    let Some(first) = ptes[0].pfn() else {
        unreachable!("folio_pte_batch from a PTE that maps no normal page");
    };
    let folio_end = folio.0 + (1 << m.zone.memmap.page(folio).order());
    debug_assert!(
        folio.0 <= first.0 && first.0 < folio_end,
        "{first} not in {folio}"
    );
    let max_nr = max_nr.min((folio_end - first.0) as usize);
    let mut nr = 1;
    while nr < max_nr && ptes[nr].pfn() == Some(Pfn(first.0 + nr as u64)) {
        nr += 1;
    }
    nr
}
