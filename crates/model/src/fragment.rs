//! The fragmentation generator behind the `fragment` statement: unmovable
//! kernel pages placed through physical memory, deterministically, so that
//! a workload can start from (or add) the long-lived unmovable allocations
//! (slab, page tables, drivers' buffers) that make a real machine's memory
//! fragmented.
//!
//! Not a kernel mechanism and no kernel file: the kernel has no such knob,
//! and its own unmovable allocations are what the generator stands in for.
//! The buddy operations it uses are Linux 6.18 `mm/page_alloc.c`'s
//! (`take_page_off_buddy`, claiming a pageblock as `set_pageblock_migratetype`
//! with `move_freepages_block` does). The pages are
//! taken as `alloc_pages(GFP_KERNEL)` would leave them (in use, not on any
//! LRU, so compaction cannot move them). They stay until the end of the run.
//!
//! Placement, with `share` of the machine's frames in all:
//! - `spread`: every pageblock (2 MiB) gets its part (share of it, rounded
//!   so the total is right), at seeded pseudo-random offsets within the
//!   block, the blocks keeping their type (MIGRATE_MOVABLE): pages an
//!   unmovable allocation stole (`__rmqueue_steal`), as on a machine where
//!   anti-fragmentation lost; no pageblock can become wholly free again;
//! - `clustered`: whole pageblocks, chosen in a seeded pseudo-random order,
//!   claimed (MIGRATE_UNMOVABLE) and filled with unmovable pages: the
//!   grouping the kernel's anti-fragmentation aims for.
//!
//! A frame already in use is not taken: `spread` tries the next offsets of
//! the same block (wrapping), `clustered` the rest of the block and then
//! further blocks; the number actually placed is returned.

use crate::mm_types::{pg, Pfn};
use crate::mmzone::PAGEBLOCK_ORDER;
use crate::Machine;
pub use hugelab_workload::FragmentPattern;

/// xorshift64*: the generator's seeded sequence.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Places `permille`/1000 of the machine's frames as unmovable pages;
/// returns how many were placed.
pub fn fragment(m: &mut Machine, permille: u32, pattern: FragmentPattern, seed: u64) -> u64 {
    m.zone.materialise_frontier();
    let spanned = m.zone.spanned_pages();
    let target = spanned * u64::from(permille) / 1000;
    let block_nr = 1u64 << PAGEBLOCK_ORDER;
    let nr_blocks = spanned.div_ceil(block_nr);
    let mut rng = Rng::new(seed);
    let mut placed = 0;
    match pattern {
        FragmentPattern::Spread => {
            for block in 0..nr_blocks {
                let start = block * block_nr;
                let len = block_nr.min(spanned - start);
                // This block's share of the target, so the total is exact.
                let want = target * (block + 1) / nr_blocks - target * block / nr_blocks;
                for _ in 0..want.min(len) {
                    let offset = rng.next() % len;
                    let taken = (0..len)
                        .map(|i| (offset + i) % len)
                        .find(|&i| take(m, Pfn(start + i)));
                    if taken.is_some() {
                        placed += 1;
                    }
                }
            }
        }
        FragmentPattern::Clustered => {
            let mut order: Vec<u64> = (0..nr_blocks).collect();
            for i in (1..order.len()).rev() {
                let j = (rng.next() % (i as u64 + 1)) as usize;
                order.swap(i, j);
            }
            'blocks: for block in order {
                let start = block * block_nr;
                for pfn in start..(start + block_nr).min(spanned) {
                    if placed == target {
                        break 'blocks;
                    }
                    if take(m, Pfn(pfn)) {
                        m.zone.set_pageblock_unmovable(Pfn(pfn));
                        placed += 1;
                    }
                }
            }
        }
    }
    m.unmovable_pages += placed;
    placed
}

/// Takes the free frame `pfn` as an unmovable kernel page.
fn take(m: &mut Machine, pfn: Pfn) -> bool {
    if !m.zone.take_page_off_buddy(pfn) {
        return false;
    }
    // A page in use that no LRU, page table or folio count knows.
    m.zone.memmap.page_mut(pfn).init(pg::HEAD, 0);
    true
}
