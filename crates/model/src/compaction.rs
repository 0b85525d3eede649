//! Memory compaction: moving movable pages out of the way so that a free
//! block of a high order exists, by direct compaction (an allocation that may
//! block) or kcompactd (woken by one that may not).
//!
//! Follows Linux 6.18 `mm/compaction.c`:
//! - `try_to_compact_pages` (the zone's deferral, `compaction_deferred`),
//!   `compact_zone` with its two scanners: the migrate scanner walks
//!   pageblocks up from the zone start (`isolate_migratepages`,
//!   `isolate_migratepages_block`: free blocks are stepped over, folios of
//!   the target order or larger skipped (`skip_isolation_on_order`), pages
//!   that are not anonymous user pages (page tables, kernel pages), pinned
//!   folios and folios the model cannot find every mapping of fail to
//!   isolate), the free scanner walks pageblocks down from the zone end
//!   (`isolate_freepages`, `isolate_freepages_block`, with the async stride),
//!   and `migrate_pages` moves each isolated folio into a free page taken
//!   from the free scanner's list (`compaction_alloc`);
//! - `__compact_finished`: COMPACT_COMPLETE when the scanners meet, and, at
//!   a pageblock boundary of the migrate scanner, COMPACT_SUCCESS when a
//!   free block of the requested order exists;
//! - `compaction_suit_allocation_order` and `compaction_suitable`
//!   (`compact_gap`, `fragmentation_index` against extfrag_threshold 500 for
//!   costly orders, from `mm/vmstat.c`);
//! - `defer_compaction`, `compaction_deferred`, `compaction_defer_reset`
//!   (`compact_considered`, `compact_defer_shift`, `compact_order_failed`);
//! - async (`MIGRATE_ASYNC`) direct compaction skips pageblocks that are not
//!   MIGRATE_MOVABLE (`suitable_migration_source`) and gives up an
//!   order-aligned block at its first failure (`skip_on_failure`); the free
//!   scanner takes free pages from MIGRATE_MOVABLE pageblocks only
//!   (`suitable_migration_target`) in every mode;
//! - `wakeup_kcompactd` and `kcompactd_do_work` (sync-light, deferring like
//!   sync direct compaction).
//!
//! Migration (mm/migrate.c `migrate_pages`, `move_to_new_folio`,
//! `remove_migration_ptes`) really moves the folio: every PTE mapping one of
//! its pages is rewritten to the new frame with its write bit, the struct
//! pages (flags, mapcounts, refcount, the folio fields on its first tails)
//! and the FolioExt go along, so do its MM-ID slots and its place on the
//! deferred split queue; the old frames go back to the buddy allocator.
//!
//! Deliberate simplifications:
//! - one zone; no watermarks (a zone is "above its watermark" for order 0
//!   when it has any free page; `compaction_suitable` asks for more than
//!   `compact_gap(order)` = 2 << order free pages);
//! - every compaction scans the whole zone (`whole_zone`): no cached scanner
//!   positions (`compact_cached_migrate_pfn`, `compact_cached_free_pfn`),
//!   no pageblock skip bits, no `fast_find_migrateblock` /
//!   `fast_isolate_freepages` and no capture of a freed page; a failed run is
//!   therefore always COMPACT_COMPLETE (or COMPACT_CONTENDED when migration
//!   ran out of free pages first), never COMPACT_PARTIAL_SKIPPED. Without
//!   `fast_isolate_freepages` the free scanner alone, with the kernel's
//!   stride (32 in async mode, and doubling in any mode over pageblocks
//!   that gave nothing), can miss free pages that a regular pattern (every
//!   other frame free) puts out of its step, where the kernel would find
//!   them on the free lists;
//! - only PTE-mapped anonymous folios move (a PMD-mapped THP is order 9, which
//!   compaction never isolates for a request of order 9 or less); HugeTLB
//!   pages, page tables, the huge zero folio and the fragmentation
//!   generator's pages are unmovable;
//! - the reverse map of an order-0 page is found by a walk of the page
//!   tables of every mm of the machine (`Machine::with_mms`; the model
//!   records the anon_vma and index of large folios only), built once per
//!   compaction run: a folio with a mapcount the walk does not explain fails
//!   to isolate;
//! - kcompactd is no thread: it runs when the statement that woke it ends
//!   (`Machine::kcompactd_max_order`, see `exec`), once, at the highest
//!   order it was woken for; no proactive compaction.

use crate::mm_types::{pg, MmId, Pfn, MAX_PAGE_ORDER, PAGE_SIZE, PMD_SIZE};
use crate::mms::MmList;
use crate::mmzone::{ZoneCompact, PAGEBLOCK_ORDER, PAGE_ALLOC_COSTLY_ORDER};
use crate::pgtable::{pte_index, Pmd, Pte};
use crate::trace::{CompactResult, Step};
use crate::vmstat::VmEvent;
use crate::Machine;

const PAGEBLOCK_NR: u64 = 1 << PAGEBLOCK_ORDER;
/// COMPACT_CLUSTER_MAX (SWAP_CLUSTER_MAX): folios isolated per batch, and
/// the async free scanner's largest stride.
const COMPACT_CLUSTER_MAX: u64 = 32;
const COMPACT_MAX_DEFER_SHIFT: u32 = 6;
/// sysctl_extfrag_threshold's default.
const EXTFRAG_THRESHOLD: i64 = 500;

/// enum compact_priority: lower is more thorough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompactPriority {
    /// COMPACT_PRIO_SYNC_FULL (MIN_COMPACT_PRIORITY).
    SyncFull,
    /// COMPACT_PRIO_SYNC_LIGHT (DEF_COMPACT_PRIORITY).
    SyncLight,
    /// COMPACT_PRIO_ASYNC (INIT_COMPACT_PRIORITY).
    Async,
}

/// enum compact_result, in the kernel's order (try_to_compact_pages keeps
/// the largest over zones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum CompactStatus {
    Skipped,
    Deferred,
    Continue,
    Complete,
    /// COMPACT_CONTENDED: migration ran out of free pages before the
    /// scanners met.
    Contended,
    Success,
}

impl CompactStatus {
    /// What `hugelab explain` shows.
    pub fn result(self) -> CompactResult {
        match self {
            CompactStatus::Success => CompactResult::Success,
            CompactStatus::Deferred => CompactResult::Deferred,
            CompactStatus::Skipped => CompactResult::Skipped,
            CompactStatus::Continue | CompactStatus::Complete | CompactStatus::Contended => {
                CompactResult::Fail
            }
        }
    }
}

impl ZoneCompact {
    /// compaction_deferred: whether to skip compaction at `order` this time.
    pub fn compaction_deferred(&mut self, order: u32) -> bool {
        let limit = 1u32 << self.defer_shift;
        if order < self.order_failed {
            return false;
        }
        self.considered += 1;
        if self.considered >= limit {
            self.considered = limit;
            return false;
        }
        true
    }

    /// defer_compaction: compaction at `order` failed; skip the next
    /// 1 << compact_defer_shift attempts at that order or above.
    pub fn defer_compaction(&mut self, order: u32) {
        self.considered = 0;
        self.defer_shift = (self.defer_shift + 1).min(COMPACT_MAX_DEFER_SHIFT);
        if order < self.order_failed {
            self.order_failed = order;
        }
    }

    /// compaction_defer_reset: compaction at `order` succeeded.
    pub fn compaction_defer_reset(&mut self, order: u32, alloc_success: bool) {
        if alloc_success {
            self.considered = 0;
            self.defer_shift = 0;
        }
        if order >= self.order_failed {
            self.order_failed = order + 1;
        }
    }
}

/// fragmentation_index (mm/vmstat.c): -1000 when a free block of `order`
/// exists; otherwise towards 0 when the failure is for lack of free memory,
/// towards 1000 when it is fragmentation.
pub fn fragmentation_index(m: &Machine, order: u32) -> i64 {
    let info = m.zone.buddyinfo();
    let (mut total, mut free_pages, mut suitable) = (0u64, 0u64, 0u64);
    for (o, &nr) in info.iter().enumerate() {
        total += nr;
        free_pages += nr << o;
        if o as u32 >= order {
            suitable += nr << (o as u32 - order);
        }
    }
    if total == 0 {
        return 0;
    }
    if suitable > 0 {
        return -1000;
    }
    let requested = 1u64 << order;
    1000 - ((1000 + free_pages * 1000 / requested) / total) as i64
}

/// compact_gap: free pages compaction needs to migrate into.
fn compact_gap(order: u32) -> u64 {
    2 << order
}

/// compaction_suitable (with __compaction_suitable) at the model's zero
/// watermarks.
pub fn compaction_suitable(m: &Machine, order: u32) -> bool {
    if m.zone.nr_free_pages() <= compact_gap(order) {
        return false;
    }
    if order > PAGE_ALLOC_COSTLY_ORDER {
        let fragindex = fragmentation_index(m, order);
        if (0..=EXTFRAG_THRESHOLD).contains(&fragindex) {
            return false;
        }
    }
    true
}

/// compaction_suit_allocation_order: Success when the order is already
/// allocatable, Skipped when compaction cannot help, else Continue.
fn compaction_suit_allocation_order(m: &Machine, order: u32) -> CompactStatus {
    if m.zone.has_free_block(order) {
        return CompactStatus::Success;
    }
    if !compaction_suitable(m, order) {
        return CompactStatus::Skipped;
    }
    CompactStatus::Continue
}

/// struct compact_control, as far as the model needs it.
struct CompactControl {
    order: u32,
    /// cc->mode == MIGRATE_ASYNC.
    async_mode: bool,
    direct: bool,
    migrate_pfn: u64,
    free_pfn: u64,
    /// Isolated folios (head, order), in scan order.
    migratepages: Vec<(Pfn, u32)>,
    nr_migratepages: u64,
    /// cc->freepages[order]: isolated free blocks by order.
    freepages: [Vec<Pfn>; MAX_PAGE_ORDER as usize + 1],
    nr_freepages: u64,
    total_migrate_scanned: u64,
    total_free_scanned: u64,
    /// Where each page of the zone is mapped: built at the first isolation.
    rmap: Option<RevMap>,
}

/// The PTEs mapping each page, from a walk of the given mms' page tables,
/// sorted by pfn: (pfn, mm id, address).
struct RevMap(Vec<(u64, MmId, u64)>);

impl RevMap {
    fn build(mms: &MmList) -> Self {
        let mut v = Vec::new();
        for mm in mms.iter() {
            for (index, pmd) in mm.pmds.range(0..=u64::MAX) {
                if let Pmd::Table(t) = pmd {
                    for (j, pte) in t.ptes.iter().enumerate() {
                        if let Some(pfn) = pte.pfn() {
                            v.push((pfn.0, mm.mm_id, index * PMD_SIZE + j as u64 * PAGE_SIZE));
                        }
                    }
                }
            }
        }
        v.sort_unstable();
        RevMap(v)
    }

    fn mappings(&self, pfn: u64) -> &[(u64, MmId, u64)] {
        let lo = self.0.partition_point(|e| e.0 < pfn);
        let hi = self.0.partition_point(|e| e.0 <= pfn);
        &self.0[lo..hi]
    }
}

/// try_to_compact_pages for one allocation (direct compaction): the zone's
/// deferral, then compact_zone at `prio`. `mms` are the address spaces whose
/// pages may be migrated.
pub fn try_to_compact_pages(
    m: &mut Machine,
    mms: &mut MmList,
    order: u32,
    prio: CompactPriority,
) -> CompactStatus {
    if prio > CompactPriority::SyncFull && m.zone.compact.compaction_deferred(order) {
        return CompactStatus::Deferred;
    }
    let async_mode = prio == CompactPriority::Async;
    let status = compact_zone(m, mms, order, async_mode, true);
    if status == CompactStatus::Success {
        m.zone.compact.compaction_defer_reset(order, false);
    } else if !async_mode && status == CompactStatus::Complete {
        // The allocation will not succeed here: defer. Async failures do
        // not defer.
        m.zone.compact.defer_compaction(order);
    }
    status
}

/// compact_zone: runs the two scanners until a free block of `order`
/// exists or they meet.
fn compact_zone(
    m: &mut Machine,
    mms: &mut MmList,
    order: u32,
    async_mode: bool,
    direct: bool,
) -> CompactStatus {
    let ret = compaction_suit_allocation_order(m, order);
    if ret != CompactStatus::Continue {
        return ret;
    }
    m.zone.materialise_frontier();
    let end = m.zone.spanned_pages();
    let mut cc = CompactControl {
        order,
        async_mode,
        direct,
        migrate_pfn: 0,
        free_pfn: (end - 1) & !(PAGEBLOCK_NR - 1),
        migratepages: Vec::new(),
        nr_migratepages: 0,
        freepages: Default::default(),
        nr_freepages: 0,
        total_migrate_scanned: 0,
        total_free_scanned: 0,
        rmap: None,
    };
    let status = loop {
        if let Some(done) = compact_finished(m, &cc) {
            break done;
        }
        if !isolate_migratepages(m, mms, &mut cc) {
            continue;
        }
        if !migrate_pages(m, mms, &mut cc) && !compact_scanners_met(&cc) {
            break CompactStatus::Contended;
        }
    };
    // release_free_list: unused free pages go back to the buddy allocator.
    for (o, list) in cc.freepages.iter_mut().enumerate() {
        for pfn in list.drain(..) {
            m.zone.free_pages(pfn, o as u32);
        }
    }
    m.stat
        .count_vm_events(VmEvent::CompactMigrateScanned, cc.total_migrate_scanned);
    m.stat
        .count_vm_events(VmEvent::CompactFreeScanned, cc.total_free_scanned);
    if !direct {
        m.stat.count_vm_events(
            VmEvent::CompactDaemonMigrateScanned,
            cc.total_migrate_scanned,
        );
        m.stat
            .count_vm_events(VmEvent::CompactDaemonFreeScanned, cc.total_free_scanned);
    }
    status
}

/// compact_scanners_met: the free and migrate scanners have crossed.
fn compact_scanners_met(cc: &CompactControl) -> bool {
    cc.free_pfn >> PAGEBLOCK_ORDER <= cc.migrate_pfn >> PAGEBLOCK_ORDER
}

/// __compact_finished: Some(result) when compaction is done.
fn compact_finished(m: &Machine, cc: &CompactControl) -> Option<CompactStatus> {
    if compact_scanners_met(cc) {
        return Some(CompactStatus::Complete);
    }
    // Always finish scanning a pageblock.
    if !cc.migrate_pfn.is_multiple_of(PAGEBLOCK_NR) {
        return None;
    }
    m.zone
        .has_movable_free_block(cc.order)
        .then_some(CompactStatus::Success)
}

/// isolate_migratepages: the next pageblock below the free scanner that is
/// a suitable source, isolated by isolate_migratepages_block. Whether any
/// folio was isolated (ISOLATE_SUCCESS).
fn isolate_migratepages(m: &mut Machine, mms: &MmList, cc: &mut CompactControl) -> bool {
    let mut low = cc.migrate_pfn;
    let mut block_end = (low | (PAGEBLOCK_NR - 1)) + 1;
    while block_end <= cc.free_pfn {
        // suitable_migration_source: async direct compaction of a movable
        // allocation takes MIGRATE_MOVABLE pageblocks only.
        if cc.async_mode && cc.direct && !m.zone.pageblock_movable(Pfn(low)) {
            low = block_end;
            cc.migrate_pfn = low;
            block_end += PAGEBLOCK_NR;
            continue;
        }
        isolate_migratepages_block(m, mms, cc, low, block_end);
        break;
    }
    if block_end > cc.free_pfn {
        cc.migrate_pfn = cc.migrate_pfn.max(low);
    }
    cc.nr_migratepages > 0
}

/// Whether the folio headed at `head` can be isolated for migration: an
/// anonymous folio, not pinned, every PTE mapping it known.
fn isolatable(m: &Machine, cc: &CompactControl, head: Pfn, order: u32) -> bool {
    let page = m.zone.memmap.page(head);
    if !page.test(pg::HEAD) || !page.test(pg::ANON) || page.test(pg::PGTABLE) {
        return false;
    }
    if crate::rmap::folio_maybe_dma_pinned(m, head) {
        return false;
    }
    let rmap = cc.rmap.as_ref().expect("built before isolation");
    let mut mapped = 0;
    for i in 0..1u64 << order {
        let pfn = head.0 + i;
        let found = rmap.mappings(pfn).len();
        if found != usize::from(m.zone.memmap.page(Pfn(pfn)).mapcount) {
            return false;
        }
        mapped += found;
    }
    mapped > 0
}

/// isolate_migratepages_block over `[low, end)`: steps over free blocks,
/// skips folios too large to move, isolates movable folios (up to
/// COMPACT_CLUSTER_MAX pages), and in async direct compaction gives up the
/// rest of an order-aligned block at its first failure.
fn isolate_migratepages_block(
    m: &mut Machine,
    mms: &MmList,
    cc: &mut CompactControl,
    mut low: u64,
    end: u64,
) {
    if cc.rmap.is_none() {
        cc.rmap = Some(RevMap::build(mms));
    }
    let order_nr = 1u64 << cc.order;
    let skip_on_failure = cc.direct && cc.async_mode;
    let mut next_skip = (low | (order_nr - 1)) + 1;
    let (mut nr_scanned, mut nr_isolated) = (0u64, 0u64);
    let first_isolated = cc.migratepages.len();
    while low < end {
        if skip_on_failure && low >= next_skip {
            if nr_isolated > 0 {
                break;
            }
            next_skip = (low | (order_nr - 1)) + 1;
        }
        nr_scanned += 1;
        let page = *m.zone.memmap.page(Pfn(low));
        if page.test(pg::BUDDY) {
            let o = page.order();
            if o > 0 {
                low += (1 << o) - 1;
                nr_scanned += (1 << o) - 1;
            }
            low += 1;
            continue;
        }
        let mut failed = false;
        if page.test(pg::HEAD) && page.order() > 0 {
            let o = page.order();
            // skip_isolation_on_order: the folio is as large as the request.
            if o >= cc.order || o >= PAGEBLOCK_ORDER {
                low += (1 << o) - 1;
                nr_scanned += (1 << o) - 1;
                failed = true;
            }
        }
        if !failed {
            let o = if page.test(pg::HEAD) { page.order() } else { 0 };
            if page.test(pg::HEAD) && isolatable(m, cc, Pfn(low), o) {
                cc.migratepages.push((Pfn(low), o));
                cc.nr_migratepages += 1 << o;
                nr_isolated += 1 << o;
                low += 1 << o;
                nr_scanned += (1 << o) - 1;
                if cc.nr_migratepages >= COMPACT_CLUSTER_MAX {
                    break;
                }
                continue;
            }
            failed = true;
        }
        debug_assert!(failed);
        if skip_on_failure {
            // Release what this order-aligned block isolated; skip its rest.
            if nr_isolated > 0 {
                cc.migratepages.truncate(first_isolated);
                cc.nr_migratepages = 0;
                nr_isolated = 0;
            }
            if low < next_skip {
                low = next_skip - 1;
                next_skip += order_nr;
            }
        }
        low += 1;
    }
    cc.migrate_pfn = low.min(end);
    cc.total_migrate_scanned += nr_scanned;
    m.stat
        .count_vm_events(VmEvent::CompactIsolated, nr_isolated);
}

/// isolate_freepages: free blocks from pageblocks below cc.free_pfn and
/// above the migrate scanner's pageblock, until there are as many free
/// pages as isolated ones; cc.free_pfn is where it restarts.
fn isolate_freepages(m: &mut Machine, cc: &mut CompactControl) {
    let low = ((cc.migrate_pfn | (PAGEBLOCK_NR - 1)) + 1) as i64;
    let spanned = m.zone.spanned_pages();
    let nr = PAGEBLOCK_NR as i64;
    let mut isolate_start = cc.free_pfn as i64;
    let mut block_start = isolate_start & !(nr - 1);
    let mut block_end = (block_start + nr).min(spanned as i64);
    let mut stride = if cc.async_mode {
        COMPACT_CLUSTER_MAX
    } else {
        1
    };
    while block_start >= low {
        if suitable_migration_target(m, Pfn(block_start as u64)) {
            let mut start = isolate_start as u64;
            let nr_isolated = isolate_freepages_block(m, cc, &mut start, block_end as u64, stride);
            isolate_start = start as i64;
            if cc.nr_freepages >= cc.nr_migratepages {
                if isolate_start >= block_end {
                    // Restart at the previous pageblock next time.
                    isolate_start = block_start - nr;
                }
                break;
            } else if isolate_start < block_end {
                break;
            }
            stride = if nr_isolated > 0 {
                1
            } else {
                (stride << 1).min(COMPACT_CLUSTER_MAX)
            };
        }
        block_end = block_start;
        block_start -= nr;
        isolate_start = block_start;
    }
    cc.free_pfn = isolate_start.max(0) as u64;
}

/// suitable_migration_target: a MIGRATE_MOVABLE pageblock that is not one
/// whole free block.
fn suitable_migration_target(m: &Machine, block: Pfn) -> bool {
    let page = m.zone.memmap.page(block);
    if page.test(pg::BUDDY) && page.order() >= PAGEBLOCK_ORDER {
        return false;
    }
    m.zone.pageblock_movable(block)
}

/// isolate_freepages_block: takes free blocks from `*start` to `end`.
fn isolate_freepages_block(
    m: &mut Machine,
    cc: &mut CompactControl,
    start: &mut u64,
    end: u64,
    stride: u64,
) -> u64 {
    let (mut nr_scanned, mut total_isolated) = (0u64, 0u64);
    let mut pfn = *start;
    while pfn < end {
        nr_scanned += 1;
        let page = *m.zone.memmap.page(Pfn(pfn));
        if page.test(pg::HEAD) && page.order() > 0 {
            let o = page.order();
            if pfn + (1 << o) <= end {
                pfn += (1 << o) - 1;
                nr_scanned += (1 << o) - 1;
            }
        } else if page.test(pg::BUDDY) {
            let o = page.order();
            m.zone.__isolate_free_page(Pfn(pfn), o);
            let isolated = 1u64 << o;
            nr_scanned += isolated - 1;
            total_isolated += isolated;
            cc.nr_freepages += isolated;
            cc.freepages[o as usize].push(Pfn(pfn));
            if cc.nr_migratepages <= cc.nr_freepages {
                pfn += isolated;
                break;
            }
            pfn += isolated - 1;
        }
        pfn += stride;
    }
    *start = pfn.min(end);
    cc.total_free_scanned += nr_scanned;
    m.stat
        .count_vm_events(VmEvent::CompactIsolated, total_isolated);
    total_isolated
}

/// compaction_alloc: a free block of `order` from the isolated free pages
/// (splitting a larger one), isolating more when there is none.
fn compaction_alloc(m: &mut Machine, cc: &mut CompactControl, order: u32) -> Option<Pfn> {
    let mut isolated = false;
    loop {
        let found = (order..=MAX_PAGE_ORDER).find(|&o| !cc.freepages[o as usize].is_empty());
        let Some(mut o) = found else {
            if isolated {
                return None;
            }
            isolate_freepages(m, cc);
            isolated = true;
            continue;
        };
        let page = cc.freepages[o as usize].remove(0);
        while o > order {
            o -= 1;
            cc.freepages[o as usize].insert(0, Pfn(page.0 + (1 << o)));
        }
        cc.nr_freepages -= 1 << order;
        cc.nr_migratepages -= 1 << order;
        return Some(page);
    }
}

/// migrate_pages (MIGRATE_ASYNC or MIGRATE_SYNC_LIGHT, MR_COMPACTION): each
/// isolated folio into a page from compaction_alloc; when no page is left
/// the rest go back (putback_movable_pages). False on -ENOMEM.
fn migrate_pages(m: &mut Machine, mms: &mut MmList, cc: &mut CompactControl) -> bool {
    let folios = std::mem::take(&mut cc.migratepages);
    let (mut succeeded, mut failed) = (0u64, 0u64);
    for (src, order) in folios {
        if failed > 0 {
            // Left on the list after -ENOMEM: put back, not counted.
            continue;
        }
        let Some(dst) = compaction_alloc(m, cc, order) else {
            // -ENOMEM: this and the remaining folios stay where they are.
            failed += 1 << order;
            continue;
        };
        migrate_folio(m, mms, cc.rmap.as_ref().expect("built"), src, dst, order);
        succeeded += 1 << order;
    }
    cc.nr_migratepages = 0;
    m.stat.count_vm_events(VmEvent::PgmigrateSuccess, succeeded);
    m.stat.count_vm_events(VmEvent::PgmigrateFail, failed);
    failed == 0
}

/// Moves the folio at `src` to `dst`: struct pages, folio fields, PTEs.
fn migrate_folio(m: &mut Machine, mms: &mut MmList, rmap: &RevMap, src: Pfn, dst: Pfn, order: u32) {
    let nr = 1u64 << order;
    for i in 0..nr {
        let page = *m.zone.memmap.page(Pfn(src.0 + i));
        *m.zone.memmap.page_mut(Pfn(dst.0 + i)) = page;
        for &(_, mm, addr) in rmap.mappings(src.0 + i) {
            let pmd = mms
                .get_mut(mm)
                .and_then(|mm| mm.pmds.get_mut(&(addr / PMD_SIZE)));
            let Some(Pmd::Table(t)) = pmd else {
                unreachable!("a mapping found by the walk went away");
            };
            let pte = &mut t.ptes[pte_index(addr)];
            *pte = Pte::new(Pfn(dst.0 + i), pte.is_writable());
        }
    }
    if order > 0 {
        let ext = *m.zone.memmap.folio_ext(src);
        *m.zone.memmap.folio_ext_mut(dst) = ext;
        if let Some(ids) = m.folio_mm_ids.remove(&src) {
            m.folio_mm_ids.insert(dst, ids);
        }
        if m.zone.memmap.page(dst).test(pg::DEFERRED) {
            m.deferred_split_queue.replace(src, dst);
        }
    }
    // folio_migrate_flags: PG_active, PG_swapbacked (lazyfree) and
    // PG_dirty go with the folio.
    let lru = m.lru.get(src);
    m.lru.forget(src);
    m.lru.set(dst, lru);
    // mem_cgroup_migrate: the charge goes with the folio.
    crate::memcontrol::mem_cgroup_migrate(m, src, dst);
    // The old folio's frames are free; the new one holds everything.
    m.zone.memmap.page_mut(src).init(pg::HEAD, 0);
    m.zone.free_pages(src, order);
}

/// wakeup_kcompactd: a failing allocation that may not compact itself asks
/// kcompactd for `order`; it runs when the statement ends (see the module
/// doc), if compaction is suitable for the order then.
pub fn wakeup_kcompactd(m: &mut Machine, order: u32) {
    if order == 0 {
        return;
    }
    m.trace(|| Step::WakeKcompactd { order });
    m.kcompactd_max_order = m.kcompactd_max_order.max(order);
}

/// kcompactd's wait condition (kcompactd_node_suitable) and
/// kcompactd_do_work: one sync-light compaction at the highest order it
/// was woken for, deferring like sync direct compaction.
pub fn kcompactd_do_work(m: &mut Machine) {
    let order = std::mem::take(&mut m.kcompactd_max_order);
    if order == 0 || compaction_suit_allocation_order(m, order) != CompactStatus::Continue {
        return;
    }
    m.stat.count_vm_event(VmEvent::CompactDaemonWake);
    if m.zone.compact.compaction_deferred(order) {
        return;
    }
    match m.with_mms(None, |m, mms| compact_zone(m, mms, order, false, false)) {
        CompactStatus::Success => m.zone.compact.compaction_defer_reset(order, false),
        CompactStatus::Complete => m.zone.compact.defer_compaction(order),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Model;
    use hugelab_workload::Backend;

    /// Runs a workload on a fresh model, its expectations unchecked.
    fn run(text: &str) -> Model {
        let w = hugelab_workload::parse("test.hlw", text).expect("parses");
        let mut model = Model::default().with_invariant_checks();
        for stmt in &w.stmts {
            if !stmt.kind.checks() {
                model.execute(stmt).expect("runs");
            }
        }
        model
    }

    /// A 64 MiB machine whose only free memory is in pageblock 0
    /// (unmovable: the page tables) and in pageblocks 3 and 4, one page
    /// short of empty each: no free 2 MiB block, and compaction can make
    /// one by moving pageblock 1's 512 pages into 3 and 4 (see
    /// scenarios/model-only/compaction-defrag-always-direct-success.hlw).
    const FRAGMENTED: &str = "machine memory=64M
set transparent_hugepage/enabled never
set transparent_hugepage/hugepages-2048kB/enabled inherit
spawn a
a mmap fill 62M align=2M
a write fill
a munmap fill+2M:2044K
a munmap fill+4M:2044K
set transparent_hugepage/enabled always
a mmap t 2M align=2M
";

    #[test]
    fn direct_compaction_moves_pages_and_the_thp_fits() {
        let mut m = run(&format!(
            "{FRAGMENTED}set transparent_hugepage/defrag always\na write t:4K\n"
        ));
        let c = m.read().unwrap().counters;
        assert_eq!(c["vmstat.thp_fault_alloc"], 1);
        assert_eq!(c["vmstat.compact_stall"], 1);
        assert_eq!(c["vmstat.compact_success"], 1);
        assert_eq!(c["vmstat.pgmigrate_success"], 512);
        // The moved pages are still the process's: same Rss, all 4K.
        assert_eq!(c["folios.a.fill.4kB"], 15872 - 2 * 511);
        assert_eq!(
            m.machine.zone.compact,
            ZoneCompact {
                considered: 0,
                defer_shift: 0,
                order_failed: 10
            }
        );
    }

    #[test]
    fn the_trace_shows_the_compaction_decision() {
        let mut m = run(&format!(
            "{FRAGMENTED}set transparent_hugepage/defrag always\n"
        ));
        m.machine.start_trace();
        let w = hugelab_workload::parse("t.hlw", &format!("{FRAGMENTED}a write t:4K\n")).unwrap();
        m.execute(w.stmts.last().unwrap()).unwrap();
        let trace = m.machine.take_trace().unwrap();
        let steps = &trace.faults[0].steps;
        assert!(steps.contains(&Step::Compact {
            order: 9,
            sync: false,
            result: CompactResult::Success
        }));
    }

    #[test]
    fn without_direct_reclaim_nothing_is_compacted() {
        let mut m = run(&format!(
            "{FRAGMENTED}set transparent_hugepage/defrag never\na write t:4K\n"
        ));
        let c = m.read().unwrap().counters;
        assert_eq!(c["vmstat.thp_fault_fallback"], 1);
        assert_eq!(c.get("vmstat.compact_stall").copied().unwrap_or(0), 0);
    }

    #[test]
    fn unmovable_pages_in_every_pageblock_fail_compaction_and_defer_it() {
        let text = "machine memory=64M
fragment unmovable=1% pattern=spread seed=7
set transparent_hugepage/enabled always
set transparent_hugepage/defrag always
spawn a
a mmap t 2M align=2M
a madvise t HUGEPAGE
a write t:4K
";
        let mut m = run(text);
        let c = m.read().unwrap().counters;
        assert_eq!(m.machine.unmovable_pages, 163);
        assert_eq!(c["vmstat.thp_fault_fallback"], 1);
        // alloc_pages_mpol's two calls: async, async; async, sync-light.
        assert_eq!(c["vmstat.compact_stall"], 4);
        assert_eq!(c["vmstat.compact_fail"], 4);
        assert_eq!(c.get("vmstat.pgmigrate_success").copied().unwrap_or(0), 0);
        // Only the sync-light failure deferred compaction.
        assert_eq!(m.machine.zone.compact.defer_shift, 1);
    }

    #[test]
    fn deferral_skips_then_lets_through() {
        let mut z = ZoneCompact::default();
        assert!(!z.compaction_deferred(9), "nothing failed yet");
        z.defer_compaction(9);
        assert!(z.compaction_deferred(9));
        assert!(!z.compaction_deferred(9), "1 << 1 attempts later");
        z.defer_compaction(9);
        assert!(z.compaction_deferred(9));
        assert!(z.compaction_deferred(9));
        assert!(z.compaction_deferred(9));
        assert!(!z.compaction_deferred(9), "1 << 2 attempts later");
        z.compaction_defer_reset(9, true);
        assert_eq!(
            z,
            ZoneCompact {
                considered: 0,
                defer_shift: 0,
                order_failed: 10
            }
        );
        assert!(!z.compaction_deferred(4), "below the failed order");
        for _ in 0..10 {
            z.defer_compaction(4);
        }
        assert_eq!(z.defer_shift, COMPACT_MAX_DEFER_SHIFT);
        assert_eq!(z.order_failed, 4);
        assert!(!z.compaction_deferred(3), "orders below 4 are not deferred");
    }

    #[test]
    fn fragmentation_index_tells_lack_of_memory_from_fragmentation() {
        let mut m = Model::new(16 << 20);
        let zone = &mut m.machine.zone;
        let pages: Vec<Pfn> = (0..4096).map(|_| zone.alloc_pages(0).unwrap()).collect();
        // Every other page free: 2048 order-0 blocks.
        for p in pages.iter().filter(|p| p.0 % 2 == 0) {
            zone.free_pages(*p, 0);
        }
        // 1000 - (1000 + 2048 * 1000 / 16) / 2048 = 1000 - 62 = 938.
        assert_eq!(fragmentation_index(&m.machine, 4), 938);
        assert!(compaction_suitable(&m.machine, 4));
        assert_eq!(fragmentation_index(&m.machine, 0), -1000);
    }
}
