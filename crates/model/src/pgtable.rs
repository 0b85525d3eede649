//! Page tables: PMD entries that are empty, a huge zero page, a PMD-mapped THP
//! or a table of 512 PTEs.
//!
//! Follows the x86_64 4-level layout of Linux 6.18 (`arch/x86/include/asm/pgtable*.h`)
//! at the two levels THP cares about, with `pte_index`. Simplifications: above
//! the PMD level, lookups go through a sorted map of PMD tables, one per GiB
//! in use (`PmdMap`); the PUD and PMD table pages still take frames (counted
//! in NR_PAGETABLE, `MmStruct::pmd_tables` / `pud_tables`) but hold no
//! entries; the P4D and PGD levels are not modelled (see `mmap`); no
//! accessed bit (the model never ages mappings); the dirty bit is kept beside
//! the PTEs, one bit per entry in `PteTable::dirty`, and in `Pmd::Huge`, and
//! only MADV_FREE ever clears it (it matters for lazily-freed folios only: a
//! new table starts all dirty, and every write fault, copy-on-write or fork
//! copy that maps a page makes its PTE dirty, as the kernel's do); no swap
//! or migration entries. So a clean PTE maps a folio that MADV_FREE cleaned,
//! which has LRU state (`swap`) as long as it lives.

use hugelab_workload::units::{Pfn, HPAGE_PMD_ORDER, PAGE_SHIFT};

/// PTRS_PER_PTE: PTEs per page table.
pub const PTRS_PER_PTE: usize = 1 << HPAGE_PMD_ORDER;

/// pte_index: the index of `addr`'s PTE in its page table.
#[inline]
pub(crate) fn pte_index(addr: u64) -> usize {
    ((addr >> PAGE_SHIFT) as usize) & (PTRS_PER_PTE - 1)
}

/// The PTE tables a folio of `nr` pages mapped from `addr` lies in: for
/// each, its PMD index, the PTE index there of the first page of the
/// folio it holds, and which of the folio's pages it holds, `[lo, hi)`.
/// One table, unless `mremap` moved the folio across a PMD boundary.
pub(crate) fn folio_pte_spans(
    addr: u64,
    nr: usize,
) -> impl Iterator<Item = (u64, usize, usize, usize)> {
    let pmd_size = (PTRS_PER_PTE as u64) << PAGE_SHIFT;
    let mut lo = 0;
    std::iter::from_fn(move || {
        if lo >= nr {
            return None;
        }
        let a = addr + ((lo as u64) << PAGE_SHIFT);
        let first = pte_index(a);
        let hi = nr.min(lo + PTRS_PER_PTE - first);
        let span = (a / pmd_size, first, lo, hi);
        lo = hi;
        Some(span)
    })
}

/// A PTE, 4 bytes: none, the shared zero page, or a present page with its
/// write permission. Present PTEs hold pfn + 2, so the model addresses at most
/// 2^31 - 3 frames (8 TiB of 4 KiB pages).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pte(u32);

const PTE_ZERO: u32 = 1;
const PTE_WRITE: u32 = 1 << 31;
pub const MAX_PFN: u64 = (PTE_WRITE - 3) as u64;

impl Pte {
    pub const NONE: Pte = Pte(0);
    /// The shared 4 KiB zero page, mapped read-only (pte_mkspecial(my_zero_pfn)).
    pub const ZERO: Pte = Pte(PTE_ZERO);

    #[inline]
    pub fn new(pfn: Pfn, writable: bool) -> Pte {
        debug_assert!(pfn.0 <= MAX_PFN);
        Pte((pfn.0 as u32 + 2) | if writable { PTE_WRITE } else { 0 })
    }
    #[inline]
    pub fn is_none(self) -> bool {
        self.0 == 0
    }
    #[inline]
    pub fn is_zero_page(self) -> bool {
        self.0 == PTE_ZERO
    }
    /// The mapped frame of a present, normal (non-zero-page) PTE.
    #[inline]
    pub fn pfn(self) -> Option<Pfn> {
        let raw = self.0 & !PTE_WRITE;
        (raw >= 2).then(|| Pfn(u64::from(raw - 2)))
    }
    #[inline]
    pub fn is_writable(self) -> bool {
        self.0 & PTE_WRITE != 0
    }
    #[inline]
    pub fn wrprotect(self) -> Pte {
        Pte(self.0 & !PTE_WRITE)
    }
    #[inline]
    pub fn mkwrite(self) -> Pte {
        if self.pfn().is_some() {
            Pte(self.0 | PTE_WRITE)
        } else {
            self
        }
    }
}

/// A page of PTEs, backed by a frame of simulated memory.
pub struct PteTable {
    pub page: Pfn,
    pub ptes: [Pte; PTRS_PER_PTE],
    /// pte_dirty of each entry, a bit per PTE (see the module doc).
    pub dirty: [u64; PTRS_PER_PTE / 64],
}

impl PteTable {
    pub fn new(page: Pfn) -> Box<Self> {
        Box::new(PteTable {
            page,
            ptes: [Pte::NONE; PTRS_PER_PTE],
            dirty: [u64::MAX; PTRS_PER_PTE / 64],
        })
    }

    /// pte_dirty of entry `i`.
    #[inline]
    pub fn pte_dirty(&self, i: usize) -> bool {
        self.dirty[i / 64] & (1 << (i % 64)) != 0
    }

    /// pte_mkdirty of entry `i`: what a store through it does (no branch).
    #[inline]
    pub fn pte_mkdirty(&mut self, i: usize) {
        self.dirty[i / 64] |= 1 << (i % 64);
    }

    /// pte_mkdirty of entry `i` when `cond`, without a branch (a write
    /// fault maps its page dirty).
    #[inline]
    pub fn pte_mkdirty_if(&mut self, i: usize, cond: bool) {
        self.dirty[i / 64] |= u64::from(cond) << (i % 64);
    }

    /// Whether every entry is dirty (no MADV_FREE left one clean).
    #[inline]
    pub fn all_dirty(&self) -> bool {
        self.dirty.iter().all(|&d| d == u64::MAX)
    }

    /// pte_mkclean of entries `[first, first + nr)`.
    pub fn pte_mkclean(&mut self, first: usize, nr: usize) {
        for i in first..first + nr {
            self.dirty[i / 64] &= !(1 << (i % 64));
        }
    }

    /// Whether any of `[first, first + nr)` is dirty.
    pub fn any_dirty(&self, first: usize, nr: usize) -> bool {
        (first..first + nr).any(|i| self.pte_dirty(i))
    }

    /// pte_range_none: all `nr` PTEs from `first` are empty.
    #[inline]
    pub fn range_none(&self, first: usize, nr: usize) -> bool {
        self.ptes[first..first + nr].iter().all(|p| p.is_none())
    }

    pub fn is_empty(&self) -> bool {
        self.ptes.iter().all(|p| p.is_none())
    }
}

/// A populated PMD entry (pmd_none is the absence of an entry).
pub enum Pmd {
    /// The huge zero folio, read-only, with the PTE table deposited for a split.
    HugeZero {
        deposit: Pfn,
    },
    /// A PMD-mapped THP, with its deposited PTE table (pgtable_trans_huge_deposit).
    Huge {
        pfn: Pfn,
        writable: bool,
        /// pmd_dirty (see the module doc).
        dirty: bool,
        deposit: Pfn,
    },
    Table(Box<PteTable>),
}

/// PMD entries per PMD table (one table maps 1 GiB).
const PTRS_PER_PMD: usize = 512;

/// A page of PMD entries; `None` is pmd_none.
struct PmdTable {
    entries: [Option<Pmd>; PTRS_PER_PMD],
    populated: u16,
}

/// The PMD level of one mm's page tables, indexed by PMD index (address / 2 MiB):
/// a sorted map of PMD tables, one per GiB of address space in use, so that a
/// lookup is a short search plus an array index.
#[derive(Default)]
pub struct PmdMap {
    tables: std::collections::BTreeMap<u64, Box<PmdTable>>,
}

#[inline]
fn split_index(index: u64) -> (u64, usize) {
    (
        index / PTRS_PER_PMD as u64,
        (index % PTRS_PER_PMD as u64) as usize,
    )
}

/// The slots `[lo, end)` of PMD table `hi` whose indexes lie in
/// `[first, last]`: a range query reads only those.
#[inline]
fn table_slice(hi: u64, first: u64, last: u64) -> (usize, usize) {
    let base = hi * PTRS_PER_PMD as u64;
    // The caller's tables lie in [first / 512, last / 512]: base <= last
    // and first < base + 512.
    let lo = first.saturating_sub(base) as usize;
    let end = last.saturating_sub(base).min(PTRS_PER_PMD as u64 - 1) as usize + 1;
    (lo, end)
}

impl PmdMap {
    #[inline]
    pub fn get(&self, index: &u64) -> Option<&Pmd> {
        let (hi, lo) = split_index(*index);
        self.tables.get(&hi)?.entries[lo].as_ref()
    }

    #[inline]
    pub fn get_mut(&mut self, index: &u64) -> Option<&mut Pmd> {
        let (hi, lo) = split_index(*index);
        self.tables.get_mut(&hi)?.entries[lo].as_mut()
    }

    pub fn contains_key(&self, index: &u64) -> bool {
        self.get(index).is_some()
    }

    pub fn insert(&mut self, index: u64, pmd: Pmd) {
        let (hi, lo) = split_index(index);
        let table = self.tables.entry(hi).or_insert_with(|| {
            Box::new(PmdTable {
                entries: std::array::from_fn(|_| None),
                populated: 0,
            })
        });
        if table.entries[lo].replace(pmd).is_none() {
            table.populated += 1;
        }
    }

    pub fn remove(&mut self, index: &u64) -> Option<Pmd> {
        let (hi, lo) = split_index(*index);
        let table = self.tables.get_mut(&hi)?;
        let pmd = table.entries[lo].take()?;
        table.populated -= 1;
        if table.populated == 0 {
            self.tables.remove(&hi);
        }
        Some(pmd)
    }

    /// Populated entries with index in `range`, in order.
    pub fn range(&self, range: std::ops::RangeInclusive<u64>) -> impl Iterator<Item = (u64, &Pmd)> {
        let (first, last) = (*range.start(), *range.end());
        self.tables
            .range(first / PTRS_PER_PMD as u64..=last / PTRS_PER_PMD as u64)
            .flat_map(move |(hi, t)| {
                let (lo, end) = table_slice(*hi, first, last);
                t.entries[lo..end]
                    .iter()
                    .enumerate()
                    .filter_map(move |(i, e)| {
                        Some((hi * PTRS_PER_PMD as u64 + (lo + i) as u64, e.as_ref()?))
                    })
            })
    }

    pub fn range_mut(
        &mut self,
        range: std::ops::RangeInclusive<u64>,
    ) -> impl Iterator<Item = (u64, &mut Pmd)> {
        let (first, last) = (*range.start(), *range.end());
        self.tables
            .range_mut(first / PTRS_PER_PMD as u64..=last / PTRS_PER_PMD as u64)
            .flat_map(move |(hi, t)| {
                let hi = *hi;
                let (lo, end) = table_slice(hi, first, last);
                t.entries[lo..end]
                    .iter_mut()
                    .enumerate()
                    .filter_map(move |(i, e)| {
                        Some((hi * PTRS_PER_PMD as u64 + (lo + i) as u64, e.as_mut()?))
                    })
            })
    }

    pub fn is_empty(&self) -> bool {
        self.tables.is_empty()
    }

    /// Host bytes of the PMD tables and PTE tables.
    pub fn footprint_bytes(&self) -> u64 {
        let ptes = self
            .range(0..=u64::MAX)
            .filter(|(_, p)| matches!(p, Pmd::Table(_)))
            .count();
        (self.tables.len() * std::mem::size_of::<PmdTable>()
            + ptes * std::mem::size_of::<PteTable>()) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_query_sees_exactly_the_entries_in_its_range() {
        let mut map = PmdMap::default();
        let at = [0u64, 1, 511, 512, 1023, 1500, 5000];
        for &i in &at {
            map.insert(i, Pmd::HugeZero { deposit: Pfn(i) });
        }
        for (first, last) in [
            (0, u64::MAX),
            (510, 512),
            (1, 1),
            (2, 510),
            (1024, 1499),
            (513, 4999),
            (5000, 5000),
            (5001, u64::MAX),
        ] {
            let want: Vec<u64> = at
                .iter()
                .copied()
                .filter(|i| (first..=last).contains(i))
                .collect();
            let got: Vec<u64> = map.range(first..=last).map(|(i, _)| i).collect();
            assert_eq!(got, want, "{first}..={last}");
            let got: Vec<u64> = map.range_mut(first..=last).map(|(i, _)| i).collect();
            assert_eq!(got, want, "{first}..={last} (mut)");
        }
    }
}
