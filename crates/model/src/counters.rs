//! The observation: every counter the model maintains, by the names of the
//! kernel files they would be read from (/proc/vmstat, hugepages-*/stats,
//! /proc/meminfo, smaps_rollup, smaps, pagemap).
//!
//! Follows Linux 6.18 `mm/vmstat.c` (`nr_anon_transparent_hugepages` is
//! NR_ANON_THPS / HPAGE_PMD_NR), `fs/proc/meminfo.c` and `fs/proc/task_mmu.c`.
//! MemTotal is the whole simulated memory (the model reserves nothing for the
//! kernel itself), plus what HVO freed of the boot memmap (free_bootmem_page
//! adds it to the managed pages); MemFree counts those frames too. The
//! HugeTLB pools are `hugetlb_report_meminfo` and hugepages/hugepages-<size>/
//! (`mm/hugetlb.c`, `mm/hugetlb_sysfs.c`).

use crate::mm_types::{HstateIdx, HPAGE_PMD_NR, HPAGE_PMD_ORDER};
use crate::reading_cache::{ReadingCache, PROCESS_FAMILIES};
use crate::task_mmu::{walk_range, FolioCounts, MemSizeStats};
use crate::vmstat::{MthpStat, VmEvent};
use crate::{hugetlb, Machine, Model, Task};
use hugelab_workload::units::PAGE_KB;
use hugelab_workload::Counters;

/// `<size>kB` as the kernel names a folio size in sysfs.
pub fn size_name(order: u32) -> String {
    format!("{}kB", PAGE_KB << order)
}

/// The folio orders an anonymous mapping can hold: 0 and THP_ORDERS_ALL_ANON.
fn anon_orders() -> impl Iterator<Item = u32> {
    std::iter::once(0).chain(2..=HPAGE_PMD_ORDER)
}

/// The names of the machine-wide counters, in no particular order.
fn machine_counter_names() -> &'static [String] {
    static NAMES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let mut names: Vec<String> = VmEvent::ALL
            .iter()
            .map(|e| format!("vmstat.{}", e.name()))
            .collect();
        for name in [
            "vmstat.nr_anon_pages",
            "vmstat.nr_anon_transparent_hugepages",
            "vmstat.nr_page_table_pages",
            "vmstat.nr_free_pages",
            "khugepaged.pages_collapsed",
            "meminfo.MemTotal",
            "meminfo.MemFree",
            "meminfo.AnonPages",
            "meminfo.AnonHugePages",
            "meminfo.PageTables",
            "meminfo.HugePages_Total",
            "meminfo.HugePages_Free",
            "meminfo.HugePages_Rsvd",
            "meminfo.HugePages_Surp",
            "meminfo.Hugepagesize",
            "meminfo.Hugetlb",
            "vmstat.nr_memmap_pages",
            "vmstat.nr_memmap_boot_pages",
        ] {
            names.push(name.to_string());
        }
        for h in 0..hugetlb::NR_HSTATES {
            for file in HUGETLB_FILES {
                names.push(format!(
                    "hugetlb.{}kB.{file}",
                    hugetlb::huge_page_size(h) >> 10
                ));
            }
        }
        for order in 2..=HPAGE_PMD_ORDER {
            for item in MthpStat::ALL {
                names.push(format!("mthp.{}.{}", size_name(order), item.name()));
            }
        }
        names
    })
}

/// The files of a HugeTLB pool (hugepages/hugepages-<size>/).
const HUGETLB_FILES: [&str; 5] = [
    "nr_hugepages",
    "free_hugepages",
    "resv_hugepages",
    "surplus_hugepages",
    "nr_overcommit_hugepages",
];

/// One file of the pool of hstate `h` (`mm/hugetlb_sysfs.c`): nr_hugepages
/// counts surplus pages too.
fn hugetlb_file(m: &Machine, h: HstateIdx, file: &str) -> Option<i64> {
    let hs = &m.hugetlb.hstates[h];
    Some(match file {
        "nr_hugepages" => hs.nr_huge_pages as i64,
        "free_hugepages" => hs.free_huge_pages as i64,
        "resv_hugepages" => hs.resv_huge_pages,
        "surplus_hugepages" => hs.surplus_huge_pages as i64,
        "nr_overcommit_hugepages" => hs.nr_overcommit_huge_pages as i64,
        _ => return None,
    })
}

/// One machine-wide counter (/proc/vmstat, /proc/meminfo, hugepages-*/stats,
/// khugepaged/, hugepages/), or None for a name that is not one.
pub fn machine_counter(m: &Machine, name: &str) -> Option<i64> {
    let kb = |pages: i64| pages * PAGE_KB as i64;
    let (family, field) = name.split_once('.')?;
    // Frames the boot memmap gave back (HVO) join total and free memory.
    let boot_freed = m.vmemmap.boot_pages_freed as i64;
    Some(match (family, field) {
        ("vmstat", "nr_memmap_pages") => m.vmemmap.nr_memmap_pages,
        ("vmstat", "nr_memmap_boot_pages") => m.vmemmap.nr_memmap_boot_pages,
        // hugetlb_report_meminfo: the default hstate's pool, and every
        // pool's memory.
        ("meminfo", "HugePages_Total") => hugetlb_file(m, 0, "nr_hugepages")?,
        ("meminfo", "HugePages_Free") => hugetlb_file(m, 0, "free_hugepages")?,
        ("meminfo", "HugePages_Rsvd") => hugetlb_file(m, 0, "resv_hugepages")?,
        ("meminfo", "HugePages_Surp") => hugetlb_file(m, 0, "surplus_hugepages")?,
        ("meminfo", "Hugepagesize") => (hugetlb::huge_page_size(0) >> 10) as i64,
        ("meminfo", "Hugetlb") => m.hugetlb.meminfo_hugetlb_kb(),
        ("hugetlb", rest) => {
            let (size, file) = rest.split_once('.')?;
            let kb: u64 = size.strip_suffix("kB")?.parse().ok()?;
            hugetlb_file(m, hugetlb::size_to_hstate(kb << 10)?, file)?
        }
        ("vmstat", "nr_anon_pages") => m.stat.nr_anon_mapped,
        ("vmstat", "nr_anon_transparent_hugepages") => m.stat.nr_anon_thps / HPAGE_PMD_NR as i64,
        ("vmstat", "nr_page_table_pages") => m.stat.nr_pagetable,
        ("vmstat", "nr_free_pages") => m.zone.nr_free_pages() as i64 + boot_freed,
        ("vmstat", event) => {
            let event = VmEvent::ALL.into_iter().find(|e| e.name() == event)?;
            m.stat.event(event) as i64
        }
        ("khugepaged", "pages_collapsed") => m.stat.khugepaged_pages_collapsed as i64,
        ("meminfo", "MemTotal") => kb(m.zone.spanned_pages() as i64 + boot_freed),
        ("meminfo", "MemFree") => kb(m.zone.nr_free_pages() as i64 + boot_freed),
        ("meminfo", "AnonPages") => kb(m.stat.nr_anon_mapped),
        ("meminfo", "AnonHugePages") => kb(m.stat.nr_anon_thps),
        ("meminfo", "PageTables") => kb(m.stat.nr_pagetable),
        ("memcg", rest) => memcg_counter(m, rest)?,
        ("mthp", stat) => {
            let (size, item) = stat.split_once('.')?;
            let order = (2..=HPAGE_PMD_ORDER).find(|&o| size_name(o) == size)?;
            let item = MthpStat::ALL.into_iter().find(|i| i.name() == item)?;
            m.stat.mthp_stat(order, item)
        }
        _ => return None,
    })
}

/// `<cg>.memory.<file>` of a memory cgroup (memcontrol), in kB like the
/// registry says, whatever the file's unit: current, peak, max (only when
/// the group has a limit), and the events the model raises.
fn memcg_counter(m: &Machine, rest: &str) -> Option<i64> {
    let (cg, file) = rest.split_once(".memory.")?;
    let g = &m.memcg.groups[m.memcg.by_name(cg)?];
    let kb = |pages: u64| (pages * PAGE_KB) as i64;
    Some(match file {
        "current" => kb(g.memory.usage),
        "peak" => kb(g.memory.watermark),
        "max" if m.memcg.limited(m.memcg.by_name(cg)) => kb(g.memory.max),
        "events.max" => g.events.max as i64,
        "events.oom" => g.events.oom as i64,
        "events.oom_kill" => g.events.oom_kill as i64,
        _ => return None,
    })
}

/// The files of a memory cgroup the model reports (see `memcg_counter`).
const MEMCG_FILES: [&str; 6] = [
    "current",
    "peak",
    "max",
    "events.max",
    "events.oom",
    "events.oom_kill",
];

/// Every counter of the model now. The machine-wide ones are read afresh
/// (a fixed number); each process's come from `cache` unless a statement
/// since they were computed may have changed them (`reading_cache`).
pub fn collect(model: &Model, cache: &mut ReadingCache) -> Counters {
    let m = &model.machine;
    let mut all: Vec<(String, i64)> = machine_counter_names()
        .iter()
        .map(|name| {
            let v = machine_counter(m, name).expect("a machine counter name");
            (name.clone(), v)
        })
        .collect();
    for g in &m.memcg.groups {
        for file in MEMCG_FILES {
            let name = format!("memcg.{}.memory.{file}", g.name);
            if let Some(v) = machine_counter(m, &name) {
                all.push((name, v));
            }
        }
    }
    cache.retain_live(&m.tasks);
    // Only processes have counters: a thread's are its process's.
    for (proc, task) in m.tasks.iter().filter(|(_, t)| t.leader) {
        cache.proc_counters(m, proc, task, process_counters);
    }
    // Family by family, process by process: nearly sorted already, so the
    // map is built in one pass after a sort that finds it (nearly) done,
    // instead of a search per counter.
    for family in 0..PROCESS_FAMILIES.len() {
        for (proc, _) in m.tasks.iter().filter(|(_, t)| t.leader) {
            all.extend_from_slice(cache.cached(proc, family).expect("computed above"));
        }
    }
    Counters::from_iter(all)
}

/// The counters of one process: minflt, and per region and in total what
/// smaps and pagemap show.
/// One counter of a process (`stat.P.*`, `smaps.P.*`, `folios.P.*`), from
/// `cache` as `collect` would report it; None for a name of no live process
/// or no such counter.
pub fn process_counter(model: &Model, cache: &mut ReadingCache, name: &str) -> Option<i64> {
    let (family, rest) = name.split_once('.')?;
    if !matches!(family, "stat" | "smaps" | "folios") {
        return None;
    }
    let proc = rest.split('.').next()?;
    let task = model.machine.tasks.get(proc).filter(|t| t.leader)?;
    let counters = cache.proc_counters(&model.machine, proc, task, process_counters);
    let at = counters
        .binary_search_by(|(n, _)| n.as_str().cmp(name))
        .ok()?;
    Some(counters[at].1)
}

pub(crate) fn process_counters(m: &Machine, proc: &str, task: &Task) -> Vec<(String, i64)> {
    let mut c = Vec::new();
    let mut put = |name: String, v: i64| c.push((name, v));
    let mm = m.mms.get(task.mm).expect("a task's mm exists");
    put(format!("stat.{proc}.minflt"), task.min_flt as i64);
    // /proc/PID/smaps prints each VMA in whole kB: a region's fields
    // are the sum of the VMAs it overlaps, whole (two regions merged into
    // one VMA both show that VMA), and the process's the sum of those VMAs,
    // each once (the agent's own mappings, which smaps_rollup would add,
    // are not the workload's).
    let mut rollup = MemSizeStats::default().fields();
    let mut summed = std::collections::BTreeSet::new();
    for (region, r) in &mm.regions {
        let mut fields = MemSizeStats::default().fields();
        let mut folios = FolioCounts::default();
        for vma in mm.vmas_in(r.start, r.start + r.len) {
            let mut mss = MemSizeStats::default();
            walk_range(m, mm, vma.start, vma.end, &mut mss, &mut folios);
            let first = summed.insert(vma.start);
            for (i, (_, kb)) in mss.fields().into_iter().enumerate() {
                fields[i].1 += kb;
                if first {
                    rollup[i].1 += kb;
                }
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
    c.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use hugelab_workload::{parse, Backend};

    /// A point read gives what a full reading gives, for every counter.
    #[test]
    fn point_reads_agree_with_the_full_reading() {
        let text = "set transparent_hugepage/hugepages-64kB/enabled always\n\
                    spawn a\na mmap buf 4M align=2M\na write buf\na fork b\n\
                    b write buf:64K\na munmap buf+1M:8K\n";
        let w = parse("t.hlw", text).unwrap();
        let mut model = Model::default();
        for stmt in &w.stmts {
            model.execute(stmt).unwrap();
        }
        let full = model.read().unwrap().counters;
        let mut cache = ReadingCache::default();
        for (name, v) in &full {
            let point = machine_counter(&model.machine, name)
                .or_else(|| process_counter(&model, &mut cache, name));
            assert_eq!(point, Some(*v), "{name}");
        }
        assert_eq!(machine_counter(&model.machine, "vmstat.no_such"), None);
        assert_eq!(process_counter(&model, &mut cache, "smaps.c.Rss"), None);
    }
}
