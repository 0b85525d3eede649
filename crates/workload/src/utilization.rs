//! How much of each large folio is really used, and what the deferred split
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
//! zero page (`__folio_split` passes RMP_USE_SHARED_ZEROPAGE to
//! `remap_page` after every successful anon split;
//! `try_to_map_unused_to_zeropage`, not for an mlocked folio or in a
//! VM_LOCKED VMA), so the processes' Rss drops by them, and the split frees
//! every subpage no mapping is left on: the zero-filled ones just remapped,
//! and the subpages of a partially mapped folio that nothing mapped any more
//! (never in Rss, but still allocated and charged to the memory cgroup until
//! the split). What the machine gets back ([`GiveBack::freed_kb`], and the
//! memory cgroup's charge drops by the same) is therefore more than the Rss
//! drop ([`GiveBack::rss_kb`]). A folio mapped by several of the scanned
//! processes (after fork) is one folio: the report unites the views of it
//! by its head PFN ([`FolioUse::pfn`]) and counts it once, its mapped
//! subpages being those any of them maps (and its zero-filled and
//! never-written ones those any of them saw so). Deliberate limits, stated in the
//! report:
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

use crate::units::Pfn;
use serde::{Deserialize, Serialize};

/// Order of a PMD-sized THP ([`crate::units::HPAGE_PMD_ORDER`]), typed as
/// [`FolioUse::order`] is.
pub const HPAGE_PMD_ORDER: u8 = crate::units::HPAGE_PMD_ORDER as u8;
/// `khugepaged/max_ptes_none` at which `thp_underused` is always false: its
/// largest value ([`crate::tunables::MAX_PTES_LIMIT`]).
pub const MAX_PTES_NONE_OFF: u32 = crate::tunables::MAX_PTES_LIMIT as u32;
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
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FolioUse {
    pub order: u8,
    /// Subpages mapped in the scanned processes (≤ 1 << order).
    pub mapped: u32,
    /// Of the mapped subpages, those whose content is all zero bytes.
    pub zero: u32,
    /// The zero-filled subpages counted once per scanned process that maps
    /// them: the Rss their remapping to the zero page takes off the
    /// processes (`zero` for the view of one process).
    pub zero_mappings: u32,
    /// Mapped by a PMD (then `mapped` is the whole folio).
    pub pmd_mapped: bool,
    /// In a VM_LOCKED VMA: the shrinker neither judges nor zero-remaps it.
    pub locked: bool,
    /// Why it exists (model only).
    pub cause: Option<FolioCause>,
    /// Mapped subpages the workload never wrote (model only; a write of
    /// zero bytes is a write, so this can be less than `zero`): the count of
    /// `never_written_bits` when the view has them.
    pub never_written: Option<u32>,
    /// On the deferred split queue (model only; a live scan cannot see it).
    pub queued: Option<bool>,
    /// The head page's PFN, when known: two views with the same PFN (two
    /// processes mapping the folio) are the same folio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pfn: Option<Pfn>,
    /// Which subpages are mapped and which of those are zero-filled, one bit
    /// per subpage (`mapped_bits[i / 64] >> (i % 64)`): what uniting two
    /// views of the folio needs. Empty when unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mapped_bits: Vec<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zero_bits: Vec<u64>,
    /// Which mapped subpages were never written, as `mapped_bits` (model
    /// only): what uniting the never-written counts of two views needs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub never_written_bits: Vec<u64>,
}

/// Words of a subpage bitmap for a folio of `order`.
pub fn subpage_words(order: u8) -> usize {
    (1usize << order).div_ceil(64)
}

/// Sets bit `i` of a subpage bitmap.
pub fn set_subpage(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
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
    /// Subpages no scanned process maps: a split frees them (a partially
    /// mapped folio keeps them allocated until then).
    pub fn unmapped(&self) -> u32 {
        self.nr_pages() - self.mapped
    }

    /// Whether `other` is another view of this same folio, one that
    /// [`FolioUse::unite`] can add.
    fn same_folio(&self, other: &FolioUse) -> bool {
        self.pfn.is_some()
            && self.pfn == other.pfn
            && self.order == other.order
            && self.mapped_bits.len() == subpage_words(self.order)
            && other.mapped_bits.len() == self.mapped_bits.len()
            && other.zero_bits.len() == self.zero_bits.len()
            && other.never_written_bits.len() == self.never_written_bits.len()
    }

    /// Adds another process's view of the same folio: the subpages either
    /// maps are mapped, the Rss of both is counted. Zero-filled and never
    /// written are properties of the subpage itself, so those of the united
    /// view are those either view saw; without the never-written bitmaps (a
    /// live scan) there is no never-written count.
    fn unite(&mut self, other: &FolioUse) {
        let count = |bits: &[u64]| bits.iter().map(|w| w.count_ones()).sum::<u32>();
        for (mine, theirs) in [
            (&mut self.mapped_bits, &other.mapped_bits),
            (&mut self.zero_bits, &other.zero_bits),
            (&mut self.never_written_bits, &other.never_written_bits),
        ] {
            for (a, b) in mine.iter_mut().zip(theirs) {
                *a |= b;
            }
        }
        self.mapped = count(&self.mapped_bits);
        self.zero = count(&self.zero_bits);
        self.never_written =
            (!self.never_written_bits.is_empty()).then(|| count(&self.never_written_bits));
        self.zero_mappings += other.zero_mappings;
        self.pmd_mapped |= other.pmd_mapped;
        self.locked |= other.locked;
        self.cause = self.cause.or(other.cause);
        self.queued = self.queued.or(other.queued);
    }
}

/// The views of what was scanned, each folio once: views with the same head
/// PFN (a folio mapped by several scanned processes) united, in the order
/// their folios were first met. Views without a PFN are kept as they are.
pub fn unite_by_pfn<'a>(folios: impl IntoIterator<Item = &'a FolioUse>) -> Vec<FolioUse> {
    let mut out: Vec<FolioUse> = Vec::new();
    let mut at: std::collections::HashMap<(Pfn, u8), usize> = std::collections::HashMap::new();
    for f in folios {
        if let Some(pfn) = f.pfn {
            if let Some(&i) = at.get(&(pfn, f.order)) {
                if out[i].same_folio(f) {
                    out[i].unite(f);
                    continue;
                }
            } else {
                at.insert((pfn, f.order), out.len());
            }
        }
        out.push(f.clone());
    }
    out
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

/// What the deferred split shrinker would split and give back. Serialized
/// with [`GiveBack::freed_kb`] as a `freed_kb` field (before `rss_kb`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct GiveBack {
    /// Fully mapped THPs split as under-used, and their zero-filled
    /// subpages (remapped to the zero page and freed).
    pub underused_folios: u64,
    pub underused_kb: u64,
    /// Partially mapped folios split, and their mapped zero-filled subpages
    /// (remapped to the zero page and freed).
    pub partial_folios: u64,
    pub partial_kb: u64,
    /// The subpages of those partially mapped folios that nothing scanned
    /// maps: freed by the split (not in any Rss before it).
    pub partial_unmapped_kb: u64,
    /// The drop of the scanned processes' Rss (summed over the processes:
    /// a zero-filled subpage two of them map leaves both Rss).
    pub rss_kb: u64,
}

impl GiveBack {
    /// Memory given back to the machine, and uncharged from the memory
    /// cgroups: every subpage the splits free.
    pub fn freed_kb(&self) -> u64 {
        self.underused_kb + self.partial_kb + self.partial_unmapped_kb
    }
}

impl Serialize for GiveBack {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("GiveBack", 7)?;
        st.serialize_field("underused_folios", &self.underused_folios)?;
        st.serialize_field("underused_kb", &self.underused_kb)?;
        st.serialize_field("partial_folios", &self.partial_folios)?;
        st.serialize_field("partial_kb", &self.partial_kb)?;
        st.serialize_field("partial_unmapped_kb", &self.partial_unmapped_kb)?;
        st.serialize_field("freed_kb", &self.freed_kb())?;
        st.serialize_field("rss_kb", &self.rss_kb)?;
        st.end()
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

/// Builds the report from the large folios of what was scanned, each folio
/// once (see [`unite_by_pfn`]).
pub fn utilization_report<'a>(
    folios: impl IntoIterator<Item = &'a FolioUse>,
    settings: ShrinkerSettings,
    buckets: usize,
) -> UtilizationReport {
    let page_kb = crate::units::PAGE_KB;
    let mut sizes: Vec<Option<SizeUtilization>> = vec![None; HPAGE_PMD_ORDER as usize + 1];
    let mut give_back = GiveBack::default();
    let mut bloat: Vec<Bloat> = Vec::new();
    for f in &unite_by_pfn(folios) {
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
        // try_to_map_unused_to_zeropage: not for an mlocked folio.
        let (remapped, rss) = if f.locked {
            (0, 0)
        } else {
            (
                u64::from(f.zero) * page_kb,
                u64::from(f.zero_mappings) * page_kb,
            )
        };
        match shrinker_verdict(f, settings) {
            ShrinkerVerdict::Kept => {}
            ShrinkerVerdict::SplitPartial => {
                give_back.partial_folios += 1;
                give_back.partial_kb += remapped;
                give_back.partial_unmapped_kb += u64::from(f.unmapped()) * page_kb;
                give_back.rss_kb += rss;
            }
            ShrinkerVerdict::SplitUnderused => {
                give_back.underused_folios += 1;
                give_back.underused_kb += remapped;
                give_back.rss_kb += rss;
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
            zero_mappings: zero,
            pmd_mapped: true,
            ..FolioUse::default()
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
        assert_eq!(r.give_back.rss_kb, r.give_back.underused_kb);
        assert_eq!(r.give_back.freed_kb(), r.give_back.underused_kb);
    }

    /// One process's view of the THP at head PFN `pfn`: subpages `mapped`
    /// mapped, of which those in `zero` zero-filled.
    fn view(pfn: u64, mapped: std::ops::Range<usize>, zero: std::ops::Range<usize>) -> FolioUse {
        let mut f = FolioUse {
            order: HPAGE_PMD_ORDER,
            pfn: Some(Pfn(pfn)),
            mapped_bits: vec![0; subpage_words(HPAGE_PMD_ORDER)],
            zero_bits: vec![0; subpage_words(HPAGE_PMD_ORDER)],
            ..FolioUse::default()
        };
        for i in mapped.clone() {
            set_subpage(&mut f.mapped_bits, i);
            f.mapped += 1;
        }
        for i in zero.filter(|i| mapped.contains(i)) {
            set_subpage(&mut f.zero_bits, i);
            f.zero += 1;
        }
        f.zero_mappings = f.zero;
        f
    }

    #[test]
    fn a_partially_mapped_split_frees_the_unmapped_subpages_too() {
        // Half unmapped, the mapped half all data (the THPs): the
        // split frees the 256 unmapped subpages; no Rss changes.
        let data = view(512, 0..256, 0..0);
        // Half unmapped, 255 of the 256 mapped subpages zero-filled.
        let sparse = view(1024, 0..256, 1..256);
        let r = utilization_report([&data, &sparse], AT_409, 10);
        let g = &r.give_back;
        assert_eq!((g.partial_folios, g.partial_kb), (2, 255 * 4));
        assert_eq!(g.partial_unmapped_kb, 2 * 256 * 4);
        assert_eq!(g.rss_kb, 255 * 4);
        assert_eq!(g.freed_kb(), (2 * 256 + 255) * 4);
        // Locked: the zero-filled subpages stay, the unmapped ones go.
        let locked = FolioUse {
            locked: true,
            ..sparse.clone()
        };
        let g = utilization_report([&locked], AT_409, 10).give_back;
        assert_eq!((g.freed_kb(), g.rss_kb), (256 * 4, 0));
    }

    #[test]
    fn freed_kb_is_the_sum_and_a_json_field() {
        let g = GiveBack {
            underused_kb: 1,
            partial_kb: 20,
            partial_unmapped_kb: 300,
            rss_kb: 4000,
            ..GiveBack::default()
        };
        assert_eq!(g.freed_kb(), 321);
        let v = serde_json::to_value(&g).unwrap();
        let mut keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        keys.sort_unstable();
        let mut want = [
            "underused_folios",
            "underused_kb",
            "partial_folios",
            "partial_kb",
            "partial_unmapped_kb",
            "freed_kb",
            "rss_kb",
        ];
        want.sort_unstable();
        assert_eq!(keys, want);
        assert_eq!(
            (v["freed_kb"].as_u64(), v["rss_kb"].as_u64()),
            (Some(321), Some(4000))
        );
    }

    #[test]
    fn a_folio_two_processes_map_is_counted_once() {
        // After fork both map the whole THP (508 zero-filled): one folio,
        // 508 subpages freed, each process's Rss drops by 508.
        let parent = view(512, 0..512, 4..512);
        let r = utilization_report([&parent, &parent.clone()], AT_409, 10);
        assert_eq!(r.sizes[0].folios(), 1);
        assert_eq!(r.sizes[0].zero_pages(), 508);
        let g = &r.give_back;
        assert_eq!((g.underused_folios, g.freed_kb()), (1, 508 * 4));
        assert_eq!(g.rss_kb, 2 * 508 * 4);
        // Each maps a different half: together the folio is fully mapped
        // (not partially, as either alone would say), and under-used.
        let first = view(512, 0..256, 4..512);
        let second = view(512, 256..512, 4..512);
        let alone = utilization_report([&first], AT_409, 10);
        assert_eq!(alone.give_back.partial_folios, 1);
        let r = utilization_report([&first, &second], AT_409, 10);
        assert_eq!(r.sizes[0].partial_folios, 0);
        let g = &r.give_back;
        assert_eq!((g.underused_folios, g.partial_folios), (1, 0));
        assert_eq!((g.freed_kb(), g.rss_kb), (508 * 4, 508 * 4));
        // Never written: a subpage either view saw never written. The first
        // process wrote subpages 0-1 of its half, the second none of its
        // half: 510 together (the larger of the two counts is 256).
        let never_written = |mut f: FolioUse, from: usize| {
            f.never_written_bits = vec![0; subpage_words(HPAGE_PMD_ORDER)];
            for i in from..512 {
                if f.mapped_bits[i / 64] >> (i % 64) & 1 == 1 {
                    set_subpage(&mut f.never_written_bits, i);
                }
            }
            f.never_written = Some(f.never_written_bits.iter().map(|w| w.count_ones()).sum());
            f.cause = Some(FolioCause::Fault);
            f
        };
        let (first, second) = (never_written(first, 2), never_written(second, 0));
        assert_eq!(
            (first.never_written, second.never_written),
            (Some(254), Some(256))
        );
        let r = utilization_report([&first, &second], AT_409, 10);
        assert_eq!(r.bloat[0].never_written_kb, 510 * 4);
        // Another folio at another PFN stays another folio.
        let other = view(1024, 0..512, 0..0);
        assert_eq!(
            utilization_report([&parent, &other], AT_409, 10).sizes[0].folios(),
            2
        );
    }
}
