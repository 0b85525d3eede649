//! How much of each large folio is really used, and what the under-used THP
//! shrinker would give back: the one report `hugelab scan` (a live process)
//! and `hugelab utilization` (the model at a snapshot) both produce.
//!
//! The histogram is the one of seed 004 (`mm/thp_utilization.c` of the
//! unmerged "THP shrinker" series): folios bucketed by how many subpages are
//! in use (not zero-filled), with the THP count and the zero-filled subpages
//! per bucket, bucket `i` of `B` covering `[i*N/B, (i+1)*N/B - 1]` and the
//! last ending at `N` — for 512 pages and 10 buckets `0-50, 51-101, …,
//! 460-512`, exactly the seed's. Here one histogram per folio size.
//!
//! The give-back prediction follows Linux 6.18 `mm/huge_memory.c`:
//! `deferred_split_scan` splits every folio on the deferred split queue that
//! is partially mapped, and a fully mapped one only if `thp_underused`
//! (more zero-filled subpages than `khugepaged/max_ptes_none`, never at
//! 511); `split_folio` then remaps the zero-filled subpages to the shared
//! zero page (`try_to_map_unused_to_zeropage`, not in VM_LOCKED VMAs), so
//! the process's Rss drops by them. Deliberate limits, stated in the report:
//!
//! - only PMD-sized THPs are queued as under-used candidates (at fault, by
//!   khugepaged and MADV_COLLAPSE), and only if `shrink_underused` was 1 when
//!   they were queued (the shrinker itself never reads the knob: a THP
//!   queued before it was turned off is still split); fully mapped mTHPs are
//!   never queued;
//! - the shrinker looks at a fully mapped THP once: if it is not under-used
//!   then, it leaves the queue for good, so a THP already examined (at any
//!   earlier reclaim, or at any reclaim while `max_ptes_none` was 511) is not
//!   split even if it qualifies now. Userspace cannot see queue membership:
//!   a live scan assumes every candidate is queued if `shrink_underused` is
//!   1 now; the model knows (`FolioUse::queued`);
//! - a pinned folio fails to split (pins are invisible from userspace);
//! - "partially mapped" is judged from the pages mapped in what was scanned:
//!   a folio also mapped by a process not scanned may be fully mapped there.

use serde::{Deserialize, Serialize};

/// Order of a PMD-sized THP (x86-64: 2 MiB of 4 KiB pages).
pub const HPAGE_PMD_ORDER: u8 = (crate::units::PMD_SHIFT - crate::units::PAGE_SHIFT) as u8;
/// `khugepaged/max_ptes_none` at which `thp_underused` is always false.
pub const MAX_PTES_NONE_OFF: u32 = (1 << HPAGE_PMD_ORDER) - 1;
/// The seed's bucket count.
pub const DEFAULT_BUCKETS: usize = 10;

/// Why a large folio exists (the model knows; a live scan cannot tell).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FolioCause {
    /// Allocated whole at a page fault (`alloc_anon_folio` /
    /// `do_huge_pmd_anonymous_page`), including a write to the huge zero PMD.
    Fault,
    /// Collapsed by khugepaged (`collapse_huge_page`).
    Khugepaged,
    /// Collapsed by `madvise(MADV_COLLAPSE)`.
    MadviseCollapse,
}

impl FolioCause {
    pub const ALL: [FolioCause; 3] = [Self::Fault, Self::Khugepaged, Self::MadviseCollapse];

    pub fn name(self) -> &'static str {
        match self {
            Self::Fault => "fault",
            Self::Khugepaged => "khugepaged",
            Self::MadviseCollapse => "madvise_collapse",
        }
    }
}

/// One large folio (order ≥ 2) as seen through what was scanned.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FolioUse {
    pub order: u8,
    /// Subpages mapped in the scanned processes (≤ 1 << order).
    pub mapped: u32,
    /// Of the mapped subpages, those whose content is all zero bytes.
    pub zero: u32,
    /// Mapped by a PMD (then `mapped` is the whole folio).
    pub pmd_mapped: bool,
    /// In a VM_LOCKED VMA: the shrinker neither judges nor zero-remaps it.
    pub locked: bool,
    /// Why it exists (model only).
    pub cause: Option<FolioCause>,
    /// Subpages the workload never wrote (model only; a write of zero bytes
    /// is a write, so this can be less than `zero`).
    pub never_written: Option<u32>,
    /// On the deferred split queue (model only; a live scan cannot see it).
    pub queued: Option<bool>,
}

impl FolioUse {
    pub fn nr_pages(&self) -> u32 {
        1 << self.order
    }
    pub fn partially_mapped(&self) -> bool {
        self.mapped < self.nr_pages()
    }
    /// Subpages in use: mapped and not zero-filled (the seed's "utilized").
    pub fn used(&self) -> u32 {
        self.mapped - self.zero
    }
}

/// The shrinker settings a prediction is made at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShrinkerSettings {
    /// `khugepaged/max_ptes_none`.
    pub max_ptes_none: u32,
    /// `transparent_hugepage/shrink_underused`.
    pub shrink_underused: bool,
}

/// What the deferred split shrinker does to one folio at `settings`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShrinkerVerdict {
    /// Left alone (not queued, or not under-used).
    Kept,
    /// Split because partially mapped.
    SplitPartial,
    /// Split by the under-used check (`thp_underused_split_page`).
    SplitUnderused,
}

/// `deferred_split_scan` and `thp_underused` on one folio. Whether it is
/// queued is the folio's `queued` when known; else a partially mapped folio
/// is (every partial unmap queues it), and a fully mapped one is if it is
/// PMD-sized and `shrink_underused` is 1 now (see the module comment).
pub fn shrinker_verdict(f: &FolioUse, s: ShrinkerSettings) -> ShrinkerVerdict {
    if f.order <= 1 {
        return ShrinkerVerdict::Kept;
    }
    let queued = f.queued.unwrap_or_else(|| {
        f.partially_mapped() || (f.order == HPAGE_PMD_ORDER && s.shrink_underused)
    });
    if !queued {
        ShrinkerVerdict::Kept
    } else if f.partially_mapped() {
        ShrinkerVerdict::SplitPartial
    } else if !f.locked && s.max_ptes_none < MAX_PTES_NONE_OFF && f.zero > s.max_ptes_none {
        ShrinkerVerdict::SplitUnderused
    } else {
        ShrinkerVerdict::Kept
    }
}

/// One bucket of a histogram: folios with `lo..=hi` subpages in use.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bucket {
    pub lo: u32,
    pub hi: u32,
    pub folios: u64,
    pub zero_pages: u64,
}

/// The histogram and totals of one folio size.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SizeUtilization {
    pub order: u8,
    pub size_kb: u64,
    /// Fully mapped folios, bucketed by subpages in use.
    pub buckets: Vec<Bucket>,
    /// Folios of this size that are only partially mapped (not bucketed:
    /// the content of their unmapped subpages is not visible).
    pub partial_folios: u64,
    pub partial_mapped_pages: u64,
    pub partial_zero_pages: u64,
    /// PMD-mapped folios among the fully mapped ones.
    pub pmd_mapped: u64,
}

impl SizeUtilization {
    pub fn folios(&self) -> u64 {
        self.buckets.iter().map(|b| b.folios).sum::<u64>() + self.partial_folios
    }
    pub fn zero_pages(&self) -> u64 {
        self.buckets.iter().map(|b| b.zero_pages).sum::<u64>() + self.partial_zero_pages
    }
}

/// What the under-used THP shrinker would split and give back.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GiveBack {
    /// Fully mapped THPs split as under-used, and their zero-filled subpages.
    pub underused_folios: u64,
    pub underused_kb: u64,
    /// Partially mapped folios split, and their mapped zero-filled subpages.
    pub partial_folios: u64,
    pub partial_kb: u64,
}

impl GiveBack {
    /// The drop of the scanned processes' Rss.
    pub fn rss_kb(&self) -> u64 {
        self.underused_kb + self.partial_kb
    }
}

/// Never-written subpages of one cause and size (model only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bloat {
    pub cause: FolioCause,
    pub size_kb: u64,
    pub folios: u64,
    pub never_written_kb: u64,
}

/// The whole report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UtilizationReport {
    pub settings: ShrinkerSettings,
    pub buckets: usize,
    /// One entry per folio size that has any folio, smallest first.
    pub sizes: Vec<SizeUtilization>,
    pub give_back: GiveBack,
    /// Attribution of never-written memory (empty for a live scan).
    pub bloat: Vec<Bloat>,
}

/// The inclusive `(lo, hi)` bounds of the buckets for folios of `nr` pages:
/// the seed's ranges, or one bucket per count when `nr` is small.
pub fn bucket_bounds(nr: u32, buckets: usize) -> Vec<(u32, u32)> {
    let b = buckets.max(1) as u64;
    if u64::from(nr) < b {
        return (0..=nr).map(|k| (k, k)).collect();
    }
    let n = u64::from(nr);
    (0..b)
        .map(|i| {
            let lo = i * n / b;
            let hi = if i + 1 == b { n } else { (i + 1) * n / b - 1 };
            (lo as u32, hi as u32)
        })
        .collect()
}

/// Index of the bucket holding `used` (bounds as from [`bucket_bounds`]).
fn bucket_of(bounds: &[(u32, u32)], used: u32) -> usize {
    bounds
        .partition_point(|&(_, hi)| hi < used)
        .min(bounds.len() - 1)
}

/// Builds the report from the large folios of what was scanned.
pub fn utilization_report<'a>(
    folios: impl IntoIterator<Item = &'a FolioUse>,
    settings: ShrinkerSettings,
    buckets: usize,
) -> UtilizationReport {
    let page_kb = crate::units::PAGE_SIZE / 1024;
    let mut sizes: Vec<Option<SizeUtilization>> = vec![None; HPAGE_PMD_ORDER as usize + 1];
    let mut give_back = GiveBack::default();
    let mut bloat: Vec<Bloat> = Vec::new();
    for f in folios {
        if f.order <= 1 || f.order > HPAGE_PMD_ORDER {
            continue;
        }
        let s = sizes[f.order as usize].get_or_insert_with(|| SizeUtilization {
            order: f.order,
            size_kb: page_kb << f.order,
            buckets: bucket_bounds(f.nr_pages(), buckets)
                .into_iter()
                .map(|(lo, hi)| Bucket {
                    lo,
                    hi,
                    folios: 0,
                    zero_pages: 0,
                })
                .collect(),
            partial_folios: 0,
            partial_mapped_pages: 0,
            partial_zero_pages: 0,
            pmd_mapped: 0,
        });
        if f.partially_mapped() {
            s.partial_folios += 1;
            s.partial_mapped_pages += u64::from(f.mapped);
            s.partial_zero_pages += u64::from(f.zero);
        } else {
            let bounds: Vec<(u32, u32)> = s.buckets.iter().map(|b| (b.lo, b.hi)).collect();
            let b = &mut s.buckets[bucket_of(&bounds, f.used())];
            b.folios += 1;
            b.zero_pages += u64::from(f.zero);
            s.pmd_mapped += u64::from(f.pmd_mapped);
        }
        let remapped = if f.locked {
            0
        } else {
            u64::from(f.zero) * page_kb
        };
        match shrinker_verdict(f, settings) {
            ShrinkerVerdict::Kept => {}
            ShrinkerVerdict::SplitPartial => {
                give_back.partial_folios += 1;
                give_back.partial_kb += remapped;
            }
            ShrinkerVerdict::SplitUnderused => {
                give_back.underused_folios += 1;
                give_back.underused_kb += remapped;
            }
        }
        if let (Some(cause), Some(nw)) = (f.cause, f.never_written) {
            let size_kb = page_kb << f.order;
            match bloat
                .iter_mut()
                .find(|b| b.cause == cause && b.size_kb == size_kb)
            {
                Some(b) => {
                    b.folios += 1;
                    b.never_written_kb += u64::from(nw) * page_kb;
                }
                None => bloat.push(Bloat {
                    cause,
                    size_kb,
                    folios: 1,
                    never_written_kb: u64::from(nw) * page_kb,
                }),
            }
        }
    }
    bloat.sort_by_key(|b| (b.cause, b.size_kb));
    UtilizationReport {
        settings,
        buckets,
        sizes: sizes.into_iter().flatten().collect(),
        give_back,
        bloat,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thp(zero: u32) -> FolioUse {
        FolioUse {
            order: HPAGE_PMD_ORDER,
            mapped: 512,
            zero,
            pmd_mapped: true,
            locked: false,
            cause: None,
            never_written: None,
            queued: None,
        }
    }

    const AT_409: ShrinkerSettings = ShrinkerSettings {
        max_ptes_none: 409,
        shrink_underused: true,
    };

    #[test]
    fn seed_bucket_ranges() {
        let b = bucket_bounds(512, 10);
        let want = [
            (0, 50),
            (51, 101),
            (102, 152),
            (153, 203),
            (204, 255),
            (256, 306),
            (307, 357),
            (358, 408),
            (409, 459),
            (460, 512),
        ];
        assert_eq!(b, want);
        assert_eq!(bucket_of(&b, 0), 0);
        assert_eq!(bucket_of(&b, 50), 0);
        assert_eq!(bucket_of(&b, 51), 1);
        assert_eq!(bucket_of(&b, 255), 4);
        assert_eq!(bucket_of(&b, 512), 9);
        // 16K folios: one bucket per count of used pages.
        assert_eq!(
            bucket_bounds(4, 10),
            [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4)]
        );
    }

    #[test]
    fn underused_means_more_zero_pages_than_max_ptes_none() {
        assert_eq!(
            shrinker_verdict(&thp(410), AT_409),
            ShrinkerVerdict::SplitUnderused
        );
        assert_eq!(shrinker_verdict(&thp(409), AT_409), ShrinkerVerdict::Kept);
        let off = ShrinkerSettings {
            max_ptes_none: MAX_PTES_NONE_OFF,
            ..AT_409
        };
        assert_eq!(shrinker_verdict(&thp(512), off), ShrinkerVerdict::Kept);
        let disabled = ShrinkerSettings {
            shrink_underused: false,
            ..AT_409
        };
        assert_eq!(shrinker_verdict(&thp(512), disabled), ShrinkerVerdict::Kept);
        let locked = FolioUse {
            locked: true,
            ..thp(512)
        };
        assert_eq!(shrinker_verdict(&locked, AT_409), ShrinkerVerdict::Kept);
        // A fully mapped mTHP is never queued; a partially mapped one is split.
        let m64 = FolioUse {
            order: 4,
            mapped: 16,
            zero: 16,
            ..thp(0)
        };
        assert_eq!(shrinker_verdict(&m64, AT_409), ShrinkerVerdict::Kept);
        let part = FolioUse { mapped: 15, ..m64 };
        assert_eq!(
            shrinker_verdict(&part, AT_409),
            ShrinkerVerdict::SplitPartial
        );
    }

    #[test]
    fn report_buckets_and_give_back() {
        let folios = [thp(508), thp(510), thp(0), thp(409), thp(410)];
        let r = utilization_report(&folios, AT_409, 10);
        assert_eq!(r.sizes.len(), 1);
        let s = &r.sizes[0];
        assert_eq!((s.buckets[0].folios, s.buckets[0].zero_pages), (2, 1018));
        assert_eq!((s.buckets[2].folios, s.buckets[2].zero_pages), (2, 819));
        assert_eq!((s.buckets[9].folios, s.buckets[9].zero_pages), (1, 0));
        assert_eq!(r.give_back.underused_folios, 3);
        assert_eq!(r.give_back.underused_kb, (508 + 510 + 410) * 4);
        assert_eq!(r.give_back.rss_kb(), r.give_back.underused_kb);
    }
}
