//! Where a region goes in its process's address space: one rule both
//! backends follow, so that a region has the same address on the model and
//! on the kernel, and with it the same page-table shape (which PMD and PUD
//! tables it needs, and when they are freed).
//!
//! A region starts at an odd multiple of its alignment — `align=` when given,
//! else 2 MiB when its length is a multiple of 2 MiB (as the kernel aligns
//! such anonymous mappings, see `__get_unmapped_area`), else the base page —
//! so it is exactly as aligned as asked and no more. Regions are laid out
//! upwards from 126 TiB, with at least 2 MiB of unmapped space between them,
//! so no two regions share a VMA or a PTE table; the kernel places a
//! process's own mappings (stack, libraries) just below 128 TiB, in another
//! 512 GiB PUD range.

use crate::units::{PAGE_SIZE, PMD_SIZE};

/// The lowest address a region may start at (before the first gap).
pub const MMAP_BASE: u64 = 0x7e00_0000_0000;

/// TASK_SIZE on x86_64 with 4-level page tables (`TASK_SIZE_MAX`): the end
/// of the user address space; an `at=` region must end at or below it.
pub const TASK_SIZE: u64 = (1 << 47) - PAGE_SIZE;

/// The default of vm.mmap_min_addr (CONFIG_DEFAULT_MMAP_MIN_ADDR, 64 KiB):
/// an `at=` region may not start below it.
pub const MMAP_MIN_ADDR: u64 = 0x1_0000;

/// After a region placed at `start` by `at=` (length `len`): the cursor
/// moves past it when it ends above the cursor and above [`MMAP_BASE`], so
/// regions placed by the rule afterwards keep clear of it (with the usual
/// 2 MiB gap); a fixed region below them leaves the cursor alone.
pub fn after_fixed_region(cursor: &mut u64, start: u64, len: u64) {
    let end = start + len;
    if end > MMAP_BASE && end > *cursor {
        *cursor = end.next_multiple_of(PMD_SIZE);
    }
}

/// The alignment a region of `len` bytes gets when `align=` is not given.
pub fn default_align(len: u64) -> u64 {
    if len.is_multiple_of(PMD_SIZE) {
        PMD_SIZE
    } else {
        PAGE_SIZE
    }
}

/// The start of the next region of `len` bytes aligned to `align`, moving
/// `cursor` (0 for a process with no region yet) past it.
pub fn place_region(cursor: &mut u64, len: u64, align: u64) -> u64 {
    let from = (*cursor).max(MMAP_BASE) + PMD_SIZE;
    let start = from.next_multiple_of(2 * align) + align;
    *cursor = (start + len).next_multiple_of(PMD_SIZE);
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_exactly_as_aligned_as_asked() {
        let mut cursor = 0;
        let a = place_region(&mut cursor, 8 << 20, PMD_SIZE);
        assert_eq!(a % PMD_SIZE, 0);
        assert_ne!(a % (2 * PMD_SIZE), 0);
        let b = place_region(&mut cursor, 1 << 20, 64 << 10);
        assert_eq!(b % (64 << 10), 0);
        assert_ne!(b % (128 << 10), 0);
        assert!(
            b >= a + (8 << 20) + PMD_SIZE,
            "a 2 MiB gap separates regions"
        );
    }
}
