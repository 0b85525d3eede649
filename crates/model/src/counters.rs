//! The observation: every counter the model maintains, by the names of the
//! kernel files they would be read from (/proc/vmstat, hugepages-*/stats,
//! /proc/meminfo, smaps_rollup, smaps, pagemap).
//!
//! Follows Linux 6.18 `mm/vmstat.c` (`nr_anon_transparent_hugepages` is
//! NR_ANON_THPS / HPAGE_PMD_NR), `fs/proc/meminfo.c` and `fs/proc/task_mmu.c`.
//! MemTotal is the whole simulated memory (the model reserves nothing for the
//! kernel itself).

use crate::mm_types::{HPAGE_PMD_NR, HPAGE_PMD_ORDER, PAGE_SIZE};
use crate::reading_cache::ReadingCache;
use crate::task_mmu::{walk_range, FolioCounts, MemSizeStats};
use crate::vmstat::{MthpStat, VmEvent};
use crate::{Machine, Model, Task};
use hugelab_workload::Counters;

/// `<size>kB` as the kernel names a folio size in sysfs.
pub fn size_name(order: u32) -> String {
    format!("{}kB", (PAGE_SIZE << order) >> 10)
}

/// The folio orders an anonymous mapping can hold: 0 and THP_ORDERS_ALL_ANON.
fn anon_orders() -> impl Iterator<Item = u32> {
    std::iter::once(0).chain(2..=HPAGE_PMD_ORDER)
}

/// Every counter of the model now. The machine-wide ones are read afresh
/// (a fixed number); each process's come from `cache` unless a statement
/// since they were computed may have changed them (`reading_cache`).
pub fn collect(model: &Model, cache: &mut ReadingCache) -> Counters {
    let m = &model.machine;
    let mut c = Counters::new();
    let mut put = |name: String, v: i64| {
        c.insert(name, v);
    };
    for event in VmEvent::ALL {
        put(
            format!("vmstat.{}", event.name()),
            m.stat.event(event) as i64,
        );
    }
    put("vmstat.nr_anon_pages".into(), m.stat.nr_anon_mapped);
    put(
        "vmstat.nr_anon_transparent_hugepages".into(),
        m.stat.nr_anon_thps / HPAGE_PMD_NR as i64,
    );
    put("vmstat.nr_page_table_pages".into(), m.stat.nr_pagetable);
    put(
        "khugepaged.pages_collapsed".into(),
        m.stat.khugepaged_pages_collapsed as i64,
    );
    put("vmstat.nr_free_pages".into(), m.zone.nr_free_pages() as i64);
    for order in 2..=HPAGE_PMD_ORDER {
        for item in MthpStat::ALL {
            put(
                format!("mthp.{}.{}", size_name(order), item.name()),
                m.stat.mthp_stat(order, item),
            );
        }
    }
    let kb = |pages: i64| pages * (PAGE_SIZE as i64 / 1024);
    put("meminfo.MemTotal".into(), kb(m.zone.spanned_pages() as i64));
    put("meminfo.MemFree".into(), kb(m.zone.nr_free_pages() as i64));
    put("meminfo.AnonPages".into(), kb(m.stat.nr_anon_mapped));
    put("meminfo.AnonHugePages".into(), kb(m.stat.nr_anon_thps));
    put("meminfo.PageTables".into(), kb(m.stat.nr_pagetable));

    cache.retain_live(&model.tasks);
    for (proc, task) in &model.tasks {
        for (name, v) in cache.proc_counters(m, proc, task, process_counters) {
            c.insert(name.clone(), *v);
        }
    }
    c
}

/// The counters of one process: minflt, and per region and in total what
/// smaps and pagemap show.
pub(crate) fn process_counters(m: &Machine, proc: &str, task: &Task) -> Vec<(String, i64)> {
    let mut c = Vec::new();
    let mut put = |name: String, v: i64| c.push((name, v));
    let mm = &task.mm;
    put(format!("stat.{proc}.minflt"), task.min_flt as i64);
    // /proc/PID/smaps prints each VMA in whole kB: a region's fields
    // are the sum of its VMAs' printed values, and the process's the sum
    // of its regions' (every VMA lies in one region; the agent's own
    // mappings, which smaps_rollup would add, are not the workload's).
    let mut rollup = MemSizeStats::default().fields();
    for (region, r) in &mm.regions {
        let mut fields = MemSizeStats::default().fields();
        let mut folios = FolioCounts::default();
        for vma in mm.vmas_in(r.start, r.start + r.len) {
            let mut mss = MemSizeStats::default();
            walk_range(m, mm, vma.start, vma.end, &mut mss, &mut folios);
            for (i, (_, kb)) in mss.fields().into_iter().enumerate() {
                fields[i].1 += kb;
                rollup[i].1 += kb;
            }
        }
        for (field, kb) in fields {
            put(format!("smaps.{proc}.{region}.{field}"), kb as i64);
        }
        for order in anon_orders() {
            let (total, pmd) = (
                folios.total[order as usize] as i64,
                folios.pmd_mapped[order as usize] as i64,
            );
            let size = size_name(order);
            put(format!("folios.{proc}.{region}.{size}"), total);
            put(format!("folios.{proc}.{region}.{size}.pte"), total - pmd);
            if order == HPAGE_PMD_ORDER {
                put(format!("folios.{proc}.{region}.{size}.pmd"), pmd);
            }
        }
    }
    for (field, kb) in rollup {
        put(format!("smaps.{proc}.{field}"), kb as i64);
    }
    c
}
