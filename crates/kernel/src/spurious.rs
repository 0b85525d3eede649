//! Spurious write faults on a huge mapping made writable in place.
//!
//! x86 does not flush the TLB when a fault only adds permissions: a write
//! fault that reuses a PMD-mapped THP or a HugeTLB page (do_huge_pmd_wp_page
//! and hugetlb_wp in Linux 6.18, after a read fault or a fork) makes the
//! entry writable with `pmdp_set_access_flags`, and `flush_tlb_fix_spurious_fault`
//! is empty. The fault drops the TLB entry of the address it took only; a
//! stale read-only entry for another part of the same huge page (a virtual
//! machine's TLB may hold a 2 MiB guest page in 4 KiB pieces) makes a later
//! write there fault again, find the entry writable, and count the fault
//! (pgfault, the task's min_flt) without changing anything. How many there
//! are depends on the CPU's TLB (none on some hosts, up to 12 per 2 MiB page
//! seen on others), not on the kernel's state: the model cannot say. So a
//! write window in which the agents faulted and a huge page of the range
//! stayed mapped where it was (the same PFN before and after) makes the
//! fault counts unknown from then on, with that reason.

use crate::pagemap::{pagemap_scan_masked, Pagemap, PAGE_IS_HUGE, PM_PFN_MASK, PM_PRESENT};
use crate::Result;
use hugelab_workload::units::PMD_SIZE;
use std::collections::BTreeMap;

/// Huge pages looked at per write, at most: a 2 MiB entry each.
const MAX_HEADS: u64 = 4096;

/// The huge pages mapped in a written range before the write: address of
/// each 2 MiB block → the PFN it maps.
#[derive(Debug)]
pub(crate) struct HugeBefore {
    pid: i32,
    start: u64,
    end: u64,
    heads: BTreeMap<u64, u64>,
}

impl HugeBefore {
    /// The huge mappings of `[start, end)` of `pid`; None when there are
    /// more than can be looked at cheaply (then any may be reused).
    pub(crate) fn scan(pid: i32, start: u64, end: u64) -> Result<Option<HugeBefore>> {
        let heads = heads(pid, start, end)?;
        Ok(heads.map(|heads| HugeBefore {
            pid,
            start,
            end,
            heads,
        }))
    }

    /// How many of them are mapped where they were after the write.
    pub(crate) fn in_place(&self) -> Result<u64> {
        if self.heads.is_empty() {
            return Ok(0);
        }
        let Some(after) = heads(self.pid, self.start, self.end)? else {
            return Ok(self.heads.len() as u64);
        };
        Ok(self
            .heads
            .iter()
            .filter(|(addr, pfn)| after.get(addr) == Some(pfn))
            .count() as u64)
    }
}

/// How many huge pages of a write's range stayed mapped in place, from its
/// scan before the write: where either scan failed or saw too many to look
/// at, as if one had (the fault counts are then in doubt).
pub(crate) fn in_place(before: Result<Option<HugeBefore>>) -> u64 {
    match before {
        Ok(Some(h)) => h.in_place().unwrap_or(1),
        Ok(None) | Err(_) => 1,
    }
}

/// The present huge entries of `[start, end)` by 2 MiB block (PAGEMAP_SCAN
/// for PAGE_IS_HUGE, then the block's first pagemap entry for its PFN).
fn heads(pid: i32, start: u64, end: u64) -> Result<Option<BTreeMap<u64, u64>>> {
    let mut pagemap = Pagemap::open(pid)?;
    let regions = pagemap_scan_masked(&pagemap, start, end, PAGE_IS_HUGE, PAGE_IS_HUGE)?;
    let mut heads = BTreeMap::new();
    for r in regions.iter().filter(|r| r.categories & PAGE_IS_HUGE != 0) {
        let mut addr = r.start;
        while addr < r.end {
            if heads.len() as u64 >= MAX_HEADS {
                return Ok(None);
            }
            let e = pagemap.read(addr, 1)?[0];
            if e & PM_PRESENT != 0 {
                heads.insert(addr, e & PM_PFN_MASK);
            }
            addr = (addr & !(PMD_SIZE - 1)) + PMD_SIZE;
        }
    }
    Ok(Some(heads))
}

/// The reason the fault counts of a write window are unknown, when they
/// may hold spurious faults: the agents faulted (`faults`) and `in_place`
/// huge pages of the range stayed mapped where they were.
pub(crate) fn why(line: u32, faults: i64, in_place: u64) -> Option<String> {
    (faults > 0 && in_place > 0).then(|| {
        format!(
            "the write of line {line} faulted on a range where {in_place} huge page(s) stayed mapped in place: a fault that makes a huge entry writable in place leaves stale TLB entries (x86 flushes none on a permission upgrade), and the spurious faults they cause, which pgfault and min_flt count, depend on the CPU's TLB, not on the kernel's state"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_faulting_write_over_a_huge_page_kept_in_place_is_in_doubt() {
        assert!(why(3, 1, 1).is_some_and(|w| w.contains("line 3")));
        assert_eq!(why(3, 0, 2), None, "no fault: nothing spurious");
        assert_eq!(why(3, 5, 0), None, "no huge page kept in place");
    }
}
