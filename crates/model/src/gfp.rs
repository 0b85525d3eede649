//! Allocation flags: the part of `include/linux/gfp_types.h` (Linux 6.18)
//! that decides what an anonymous-memory allocation may do when no free
//! block of its order exists. A header: the flags are picked where the
//! kernel picks them (`huge_memory::vma_thp_gfp_mask`,
//! `khugepaged::khugepaged_gfp`).
//!
//! Simplifications: only the three bits that change a decision in the model
//! are kept (`__GFP_DIRECT_RECLAIM`, `__GFP_KSWAPD_RECLAIM`, `__GFP_NORETRY`);
//! the zone, movability and accounting bits are implied (every user page is
//! GFP_HIGHUSER_MOVABLE-movable and memcg-charged).

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
