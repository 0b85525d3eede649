//! The khugepaged thread paced by the time that passes: `sleep` statements
//! advance the model's clock, and khugepaged makes the passes that fall in
//! them, each limited by pages_to_scan, with its scan cursor carried from
//! pass to pass.
//!
//! Follows Linux 6.18 `mm/khugepaged.c`:
//! - `khugepaged()`: `khugepaged_do_scan`, then `khugepaged_wait_work`
//!   (scan_sleep_millisecs), forever while the PMD size is enabled.
//! - `khugepaged_do_scan`: `khugepaged_scan_mm_slot` from the cursor
//!   (`khugepaged_scan.mm_slot` and `.address`) until the progress reaches
//!   pages_to_scan, or the cursor passes the list's head a second time. A
//!   first SCAN_ALLOC_HUGE_PAGE_FAIL makes it sleep alloc_sleep_millisecs
//!   (`khugepaged_alloc_sleep`) and go on; a second ends the pass.
//! - `khugepaged_scan_mm_slot`'s progress ([`khugepaged_scan_mm_slot`]): 1 for
//!   the mm, 1 per VMA passed over, HPAGE_PMD_NR per PMD range; a collapse
//!   attempt ends the visit (the mmap lock was dropped), and the pass goes on
//!   in the same mm. At the end of the list `khugepaged_full_scans` counts one.
//! - A write to scan_sleep_millisecs or alloc_sleep_millisecs
//!   (`scan_sleep_millisecs_store`: `khugepaged_sleep_expire = 0` and a
//!   wake-up) makes khugepaged pass at once; the next pass comes
//!   scan_sleep_millisecs after it.
//!
//! Time passes only at `sleep`: every other statement takes no time.
//! The clock starts at 0 when the machine does; khugepaged's first pass is
//! due scan_sleep_millisecs later (the model's choice of phase: as if it had
//! just passed when the workload started).
//!
//! Deliberate simplifications:
//! - A pass takes no time, except alloc_sleep_millisecs when it backed off
//!   after a failed allocation: the next pass is due that much later. The
//!   whole pass happens at the time it starts, even when its back-off would
//!   end after the sleep does.
//! - With scan_sleep_millisecs 0 khugepaged would scan without pause for the
//!   whole sleep, however many passes that is: a sleep is then one
//!   `khugepaged` statement (every registered mm scanned to its end).
//! - The list's order is the task list's (see [`crate::khugepaged`]), not the
//!   order of registration; registering the first mm (the list was empty)
//!   does not wake khugepaged.
//! - Starting the thread (enabling the PMD size) makes no pass and keeps the
//!   clock's schedule; while the PMD size is disabled a due pass is skipped.
//! - The `khugepaged` statement leaves the cursor at the list's head and the
//!   next pass scan_sleep_millisecs after it.

use crate::khugepaged::{
    hugepage_pmd_enabled, khugepaged_do_scan, khugepaged_mm_head, khugepaged_scan_mm_slot,
};
use crate::mm_types::MmId;
use crate::trace::Scan;
use crate::Machine;

const NS_PER_MS: u64 = 1_000_000;

/// `khugepaged_scan` (the cursor) and the thread's clock.
#[derive(Clone, Debug, Default)]
pub struct KhugepagedScan {
    /// khugepaged_scan.mm_slot: the mm being scanned; None at the head.
    pub mm_slot: Option<MmId>,
    /// khugepaged_scan.address: where the scan of `mm_slot` goes on.
    pub address: u64,
    /// The list as of the last visit, to find the mm after one that left it.
    pub last_head: Vec<MmId>,
    /// khugepaged_full_scans: passes that reached the end of the list.
    pub full_scans: u64,
    /// The model's time, ns: the sum of the sleeps so far.
    pub now: u64,
    /// When the next pass is due, ns (None: scan_sleep_millisecs after the
    /// start, set at the first sleep).
    pub next_pass: Option<u64>,
}

/// `sleep`: `ns` of time pass, and khugepaged makes every pass due in them.
pub fn khugepaged_sleep(m: &mut Machine, ns: u64) {
    let scan_sleep = m.thp.khugepaged.scan_sleep_millisecs * NS_PER_MS;
    m.khugepaged.now += ns;
    let mut due = m.khugepaged.next_pass.unwrap_or(scan_sleep);
    if scan_sleep == 0 {
        if ns > 0 {
            khugepaged_statement(m);
        }
        m.khugepaged.next_pass = Some(m.khugepaged.now);
        return;
    }
    if due <= m.khugepaged.now && !hugepage_pmd_enabled(m) {
        // No thread: every pass due in the sleep is skipped at once, so a
        // long sleep costs nothing (the schedule is kept).
        due += (m.khugepaged.now - due) / scan_sleep * scan_sleep + scan_sleep;
    }
    while due <= m.khugepaged.now {
        let backed_off = khugepaged_pass(m);
        let took = if backed_off {
            m.thp.khugepaged.alloc_sleep_millisecs * NS_PER_MS
        } else {
            0
        };
        due += took + scan_sleep;
    }
    m.khugepaged.next_pass = Some(due);
}

/// A write to scan_sleep_millisecs or alloc_sleep_millisecs (the new value
/// already set): khugepaged wakes and passes now, then waits the new
/// scan_sleep_millisecs.
pub fn khugepaged_sleep_store(m: &mut Machine) {
    let backed_off = hugepage_pmd_enabled(m) && khugepaged_pass(m);
    let k = &m.thp.khugepaged;
    let took = if backed_off {
        k.alloc_sleep_millisecs * NS_PER_MS
    } else {
        0
    };
    m.khugepaged.next_pass = Some(m.khugepaged.now + took + k.scan_sleep_millisecs * NS_PER_MS);
}

/// The `khugepaged` statement: every registered mm scanned to its end; the
/// cursor is back at the head and the next pass a full sleep away.
pub fn khugepaged_statement(m: &mut Machine) {
    khugepaged_do_scan(m);
    let k = &mut m.khugepaged;
    k.mm_slot = None;
    k.address = 0;
    k.next_pass = Some(k.now + m.thp.khugepaged.scan_sleep_millisecs * NS_PER_MS);
}

/// khugepaged_do_scan with pages_to_scan's budget, from the cursor: whether
/// it backed off (khugepaged_alloc_sleep) after a failed allocation.
pub fn khugepaged_pass(m: &mut Machine) -> bool {
    let pages = m.thp.khugepaged.pages_to_scan;
    let (mut progress, mut pass_through_head) = (0u64, 0u32);
    let (mut wait, mut backed_off) = (true, false);
    // The last range's result, kept across visits that scan no range.
    let mut result = Scan::Succeed;
    loop {
        let head = khugepaged_mm_head(m);
        if m.khugepaged.mm_slot.is_none() {
            pass_through_head += 1;
        }
        if !head.is_empty() && pass_through_head < 2 {
            let (p, r) = scan_slot(m, &head, pages - progress);
            progress += p;
            result = r.unwrap_or(result);
        } else {
            progress = pages;
        }
        if progress >= pages {
            break;
        }
        if result == Scan::AllocHugePageFail {
            if !wait {
                break;
            }
            wait = false;
            backed_off = true;
        }
    }
    backed_off
}

/// One call of khugepaged_scan_mm_slot on the cursor's mm (the list's
/// first when the cursor is at the head), moving the cursor to the next mm
/// when this one is done: the progress and the last range's result, if it
/// scanned one.
///
/// No kernel function: the cursor's part of khugepaged_scan_mm_slot (taking the slot, and collect_mm_slot's move).
fn scan_slot(m: &mut Machine, head: &[MmId], pages: u64) -> (u64, Option<Scan>) {
    let k = &mut m.khugepaged;
    let id = match k.mm_slot {
        None => {
            k.address = 0;
            head[0]
        }
        Some(id) => id,
    };
    k.mm_slot = Some(id);
    let (progress, done, result) = if head.contains(&id) {
        let mut address = k.address;
        let r = m.with_mm(id, |m, mm| {
            khugepaged_scan_mm_slot(m, mm, &mut address, pages)
        });
        m.khugepaged.address = address;
        (r.progress, r.done, r.result)
    } else {
        // An mm that exited (or left the list) while the cursor was on it:
        // its visit finds it gone (hpage_collapse_test_exit).
        (1, true, None)
    };
    let k = &mut m.khugepaged;
    if done {
        // The next mm of the list as it was, still registered.
        let order = if head.contains(&id) {
            head
        } else {
            &k.last_head[..]
        };
        let at = order.iter().position(|x| *x == id);
        let next = at.and_then(|i| order[i + 1..].iter().find(|x| head.contains(x)));
        k.address = 0;
        k.mm_slot = next.copied();
        if k.mm_slot.is_none() {
            k.full_scans += 1;
        }
    }
    k.last_head = head.to_vec();
    (progress, result)
}

#[cfg(test)]
mod tests {
    use hugelab_workload::Counters;

    /// The counters at the end of `body`, after settings with PMD THP under
    /// madvise, pages_to_scan `pages` and scan_sleep_millisecs 1000.
    fn end(pages: u64, body: &str) -> Counters {
        crate::end_counters(&format!(
            "set transparent_hugepage/enabled madvise\n\
             set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
             set transparent_hugepage/khugepaged/max_ptes_none 511\n\
             set transparent_hugepage/khugepaged/pages_to_scan {pages}\n\
             set transparent_hugepage/khugepaged/scan_sleep_millisecs 1000\n\
             spawn a\n\
             a mmap buf 8M align=2M\n\
             a write buf\n\
             a madvise buf HUGEPAGE\n\
             {body}"
        ))
    }

    fn collapsed(c: &Counters) -> i64 {
        c["khugepaged.pages_collapsed"]
    }

    #[test]
    fn no_pass_before_scan_sleep_has_passed() {
        assert_eq!(collapsed(&end(4096, "sleep 999ms\n")), 0);
        assert_eq!(collapsed(&end(4096, "sleep 500ms\nsleep 500ms\n")), 4);
    }

    #[test]
    fn each_pass_scans_pages_to_scan_worth_of_ranges_from_the_cursor() {
        // 1024 pages: two PMD ranges a pass (the mm's own cost, 1, fits in
        // the second range's 512).
        assert_eq!(collapsed(&end(1024, "sleep 1s\n")), 2);
        assert_eq!(collapsed(&end(1024, "sleep 1s\nsleep 1s\n")), 4);
        assert_eq!(collapsed(&end(1024, "sleep 2500ms\n")), 4);
        assert_eq!(collapsed(&end(512, "sleep 3s\n")), 3);
        // pages_to_scan 1 still scans one range: the budget is checked
        // after each range.
        assert_eq!(collapsed(&end(1, "sleep 4s\n")), 4);
    }

    #[test]
    fn a_write_to_scan_sleep_makes_a_pass_at_once() {
        let c = end(
            1024,
            "set transparent_hugepage/khugepaged/scan_sleep_millisecs 2000\nsleep 1999ms\n",
        );
        assert_eq!(collapsed(&c), 2);
    }

    #[test]
    fn the_khugepaged_statement_scans_everything_and_resets_the_clock() {
        let c = end(512, "sleep 900ms\nkhugepaged\nsleep 900ms\n");
        assert_eq!(collapsed(&c), 4);
        assert_eq!(c["vmstat.thp_collapse_alloc"], 4);
    }

    #[test]
    fn a_failed_allocation_backs_off_for_alloc_sleep_millisecs() {
        // No free 2M block: the first failure sleeps alloc_sleep_millisecs
        // (60 s by default) and the pass goes on; the second ends it. The
        // next pass is due 60 s + 1 s after the first.
        let failed = |sleeps: &str| {
            crate::end_counters(&format!(
                "machine memory=64M\n\
                 set transparent_hugepage/enabled madvise\n\
                 set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
                 set transparent_hugepage/khugepaged/max_ptes_none 511\n\
                 set transparent_hugepage/khugepaged/scan_sleep_millisecs 1000\n\
                 spawn a\n\
                 a mmap buf 8M align=2M\n\
                 a write buf\n\
                 a madvise buf HUGEPAGE\n\
                 fragment unmovable=100%\n\
                 {sleeps}"
            ))["vmstat.thp_collapse_alloc_failed"]
        };
        assert_eq!(failed("sleep 1s\n"), 2);
        assert_eq!(failed("sleep 1s\nsleep 60999ms\n"), 2);
        assert_eq!(failed("sleep 1s\nsleep 61s\n"), 4);
    }

    #[test]
    fn the_cursor_goes_on_to_the_next_process_and_wraps_once() {
        // 1536 pages: three ranges a pass. Pass 1: a's two, b's first.
        // Pass 2: b's second, then from the head: a's two, PMD-mapped now,
        // use up the budget (512 each) without collapsing.
        let collapsed = |sleeps: &str| {
            crate::end_counters(&format!(
                "set transparent_hugepage/enabled madvise\n\
                 set transparent_hugepage/hugepages-2048kB/enabled inherit\n\
                 set transparent_hugepage/khugepaged/max_ptes_none 511\n\
                 set transparent_hugepage/khugepaged/pages_to_scan 1536\n\
                 set transparent_hugepage/khugepaged/scan_sleep_millisecs 400\n\
                 spawn a\nspawn b\n\
                 a mmap buf 4M align=2M\nb mmap buf 4M align=2M\n\
                 a write buf\nb write buf\n\
                 a madvise buf HUGEPAGE\nb madvise buf HUGEPAGE\n\
                 {sleeps}"
            ))["khugepaged.pages_collapsed"]
        };
        assert_eq!(collapsed("sleep 500ms\n"), 3);
        assert_eq!(collapsed("sleep 900ms\n"), 4);
        let k = {
            let w = hugelab_workload::parse(
                "t.hlw",
                "set transparent_hugepage/khugepaged/pages_to_scan 1536\n\
                 set transparent_hugepage/khugepaged/scan_sleep_millisecs 400\n\
                 spawn a\na mmap buf 4M align=2M\na write buf\na madvise buf HUGEPAGE\n\
                 sleep 900ms\n",
            )
            .unwrap();
            let mut model = crate::Model::default();
            hugelab_workload::run(&mut model, &w).unwrap();
            model.machine.khugepaged.clone()
        };
        // a alone: each pass starts at the head and reaches the end of the
        // list (a full scan), where passing the head a second time ends it,
        // the budget not used up: the cursor is left at the head.
        assert_eq!(k.full_scans, 2);
        assert_eq!(k.mm_slot, None);
    }
}
