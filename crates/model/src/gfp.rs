//! Allocation flags: the part of `include/linux/gfp_types.h` (Linux 6.18)
//! that decides what an anonymous-memory allocation may do when no free
//! block of its order exists, and `vma_thp_gfp_mask` (mm/huge_memory.c),
//! which picks them for a THP from `defrag` and MADV_HUGEPAGE.
//!
//! Simplifications: only the three bits that change a decision in the model
//! are kept (`__GFP_DIRECT_RECLAIM`, `__GFP_KSWAPD_RECLAIM`, `__GFP_NORETRY`);
//! the zone, movability and accounting bits are implied (every user page is
//! GFP_HIGHUSER_MOVABLE-movable and memcg-charged).

use crate::huge_mm::ThpSettings;
use crate::mm_types::Vma;
use hugelab_workload::ThpDefrag;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub struct Gfp {
    /// __GFP_DIRECT_RECLAIM: the allocation may block to reclaim and compact
    /// (`gfpflags_allow_blocking`); a memcg charge may reclaim too.
    pub direct_reclaim: bool,
    /// __GFP_KSWAPD_RECLAIM: a failing allocation wakes kswapd and kcompactd.
    pub kswapd_reclaim: bool,
    /// __GFP_NORETRY: a costly order gives up when its async compaction was
    /// skipped or deferred, and otherwise after one more async try (no
    /// retry loop).
    pub noretry: bool,
}

impl Gfp {
    /// GFP_HIGHUSER_MOVABLE: order-0 user pages (do_anonymous_page's
    /// folio_prealloc, wp_page_copy): both reclaim bits.
    pub const HIGHUSER_MOVABLE: Gfp = Gfp {
        direct_reclaim: true,
        kswapd_reclaim: true,
        noretry: false,
    };
    /// GFP_TRANSHUGE_LIGHT: no reclaim and no compaction of any kind.
    pub const TRANSHUGE_LIGHT: Gfp = Gfp {
        direct_reclaim: false,
        kswapd_reclaim: false,
        noretry: false,
    };
    /// GFP_TRANSHUGE: LIGHT | __GFP_DIRECT_RECLAIM (khugepaged with
    /// `khugepaged/defrag` 1, MADV_COLLAPSE, `defrag` always).
    pub const TRANSHUGE: Gfp = Gfp {
        direct_reclaim: true,
        ..Gfp::TRANSHUGE_LIGHT
    };

    /// gfpflags_allow_blocking.
    pub fn allows_blocking(self) -> bool {
        self.direct_reclaim
    }

    /// The flags as the kernel would spell them, for explanations.
    pub fn describe(self) -> String {
        let mut s = String::from(if self == Gfp::HIGHUSER_MOVABLE {
            "GFP_HIGHUSER_MOVABLE"
        } else if self.direct_reclaim {
            "GFP_TRANSHUGE"
        } else {
            "GFP_TRANSHUGE_LIGHT"
        });
        if self != Gfp::HIGHUSER_MOVABLE {
            if self.kswapd_reclaim {
                s.push_str("|__GFP_KSWAPD_RECLAIM");
            }
            if self.noretry {
                s.push_str("|__GFP_NORETRY");
            }
        }
        s
    }
}

/// vma_thp_gfp_mask: the flags of every THP fault allocation (PMD and mTHP
/// orders alike), from `defrag` and whether the VMA is madvised.
pub fn vma_thp_gfp_mask(thp: &ThpSettings, vma: &Vma) -> Gfp {
    let madvised = vma.flags & Vma::VM_HUGEPAGE != 0;
    let light = Gfp::TRANSHUGE_LIGHT;
    match thp.defrag {
        // Always do synchronous compaction; non-madvised VMAs do not retry.
        ThpDefrag::Always => Gfp {
            noretry: !madvised,
            ..Gfp::TRANSHUGE
        },
        // Kick kcompactd and fail quickly.
        ThpDefrag::Defer => Gfp {
            kswapd_reclaim: true,
            ..light
        },
        // Synchronous compaction if madvised, otherwise kick kcompactd.
        ThpDefrag::DeferMadvise => Gfp {
            direct_reclaim: madvised,
            kswapd_reclaim: !madvised,
            ..light
        },
        // Only do synchronous compaction if madvised.
        ThpDefrag::Madvise => Gfp {
            direct_reclaim: madvised,
            ..light
        },
        ThpDefrag::Never => light,
    }
}

/// alloc_hugepage_khugepaged_gfpmask: `khugepaged/defrag` picks direct
/// reclaim or none; MADV_COLLAPSE always passes GFP_TRANSHUGE.
///
/// Not alloc_hugepage_khugepaged_gfpmask: it also gives MADV_COLLAPSE's GFP_TRANSHUGE, as alloc_charge_folio chooses.
pub fn khugepaged_gfp(thp: &ThpSettings, khugepaged: bool) -> Gfp {
    if !khugepaged || thp.khugepaged.defrag != 0 {
        Gfp::TRANSHUGE
    } else {
        Gfp::TRANSHUGE_LIGHT
    }
}
