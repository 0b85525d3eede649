//! The exposition, in the Prometheus text format 0.0.4 (what every
//! Prometheus and `promtool check metrics` read).
//!
//! The machine's counters keep their kernel names: a registry field
//! `<family>.<field>` is `hugelab_<family>_<field>`, the size of an mTHP or
//! HugeTLB directory (`hugepages-<size>`) a `size` label spelled as the
//! kernel spells it (`64kB`). Type, unit and HELP come from the counter
//! registry (`hugelab_workload::counters`): an event counter is a counter
//! ending in `_total`, a gauge keeps its unit as a suffix (`_pages`,
//! `_folios`, `_hugepages`), kB become bytes (`_bytes`), and the HELP is the
//! registry's meaning and the file the kernel keeps it in.

use super::figures::{CgroupFigures, Cost, Pass, Skip};
use hugelab_workload::counters::{self, CounterKind, Family, Field, Unit};
use hugelab_workload::Counters;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::UNIX_EPOCH;

/// The Content-Type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
}

/// The exposition being written: each family's HELP and TYPE, then its
/// samples.
#[derive(Default)]
pub struct Exposition {
    out: String,
}

impl Exposition {
    pub fn family(&mut self, name: &str, kind: Kind, help: &str) {
        let kind = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
        };
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    pub fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            let l: Vec<String> = labels
                .iter()
                .map(|(k, v)| {
                    let v = v
                        .replace('\\', "\\\\")
                        .replace('"', "\\\"")
                        .replace('\n', "\\n");
                    format!("{k}=\"{v}\"")
                })
                .collect();
            let _ = write!(self.out, "{{{}}}", l.join(","));
        }
        let _ = writeln!(self.out, " {value}");
    }

    /// A family of one sample.
    fn single(&mut self, name: &str, kind: Kind, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    pub fn finish(self) -> String {
        self.out
    }
}

/// A registry field as a metric.
#[derive(Debug, PartialEq)]
pub struct Metric {
    pub name: String,
    pub kind: Kind,
    /// What the kernel's value is multiplied by (1024 for kB).
    pub scale: f64,
    pub help: String,
}

/// The metric of `field` of `family`.
pub fn registry_metric(family: &Family, field: &Field) -> Metric {
    let base = format!("hugelab_{}_{}", family.name, field.name);
    // A name that says what it counts keeps it (nr_hugepages,
    // nr_anon_transparent_hugepages, nr_memmap_pages).
    let suffixed = |unit: &str| {
        if base.ends_with(unit) || (unit == "folios" && base.ends_with("hugepages")) {
            base.clone()
        } else {
            format!("{base}_{unit}")
        }
    };
    let (name, kind, scale) = match (field.kind, field.unit) {
        (CounterKind::Event, _) => (format!("{base}_total"), Kind::Counter, 1.0),
        (CounterKind::Gauge, Unit::Kb) => (suffixed("bytes"), Kind::Gauge, 1024.0),
        (CounterKind::Gauge, Unit::Pages) => (suffixed("pages"), Kind::Gauge, 1.0),
        (CounterKind::Gauge, Unit::Folios) => (suffixed("folios"), Kind::Gauge, 1.0),
        (CounterKind::Gauge, Unit::HugePages) => (suffixed("hugepages"), Kind::Gauge, 1.0),
        (CounterKind::Gauge, Unit::Count) => (base.clone(), Kind::Gauge, 1.0),
    };
    let mut source = family.source.to_string();
    for placeholder in ["<stat>", "<field>", "<file>"] {
        source = source.replace(placeholder, field.name);
    }
    if source == family.source {
        source = format!("{source} {}", field.name);
    }
    Metric {
        name,
        kind,
        scale,
        help: format!("{} (kernel: {source})", field.what),
    }
}

/// Whether the machine's counter `field` of `family` is exported: the huge
/// page counters (every thp_* of vmstat, the anon THPs and the vmemmap, all
/// of the mTHP stats, khugepaged's and the HugeTLB pools).
fn exported(family: &str, field: &str) -> bool {
    match family {
        "vmstat" => {
            field.starts_with("thp_")
                || field.starts_with("nr_memmap")
                || field == "nr_anon_transparent_hugepages"
        }
        "mthp" | "khugepaged" | "hugetlb" => true,
        _ => false,
    }
}

/// A field's values, by size (mTHP and HugeTLB) or alone.
type Samples = Vec<(Option<u64>, i64)>;

/// The machine's counters, as the kernel crate's reader named them.
pub fn machine(out: &mut Exposition, read: &Counters) {
    // (family, field) -> the samples, by size.
    let mut by_field: BTreeMap<(&str, &str), Samples> = BTreeMap::new();
    for (name, &v) in read {
        let Some(c) = counters::lookup(name) else {
            continue;
        };
        if exported(c.family.name, c.field.name) {
            by_field
                .entry((c.family.name, c.field.name))
                .or_default()
                .push((c.size_kb, v));
        }
    }
    for family in counters::FAMILIES {
        for field in family.fields {
            let Some(samples) = by_field.get_mut(&(family.name, field.name)) else {
                continue;
            };
            // The smallest size first (the names sort 2048kB before 64kB).
            samples.sort_unstable_by_key(|s| s.0);
            let m = registry_metric(family, field);
            out.family(&m.name, m.kind, &m.help);
            for (size, v) in samples.iter() {
                let value = *v as f64 * m.scale;
                match size {
                    Some(kb) => out.sample(&m.name, &[("size", &format!("{kb}kB"))], value),
                    None => out.sample(&m.name, &[], value),
                }
            }
        }
    }
}

const KB: f64 = 1024.0;

/// The registry's meaning of smaps field `name`, for the per-cgroup sums.
fn smaps_means(name: &str) -> String {
    let what = counters::lookup(&format!("smaps.p.{name}")).map_or("", |c| c.field.what);
    format!("{what} (smaps {name}, summed over the cgroup's processes at the last scan)")
}

/// One gauge per cgroup.
fn per_cgroup(
    out: &mut Exposition,
    name: &str,
    help: &str,
    cgroups: &BTreeMap<String, CgroupFigures>,
    value: impl Fn(&CgroupFigures) -> f64,
) {
    out.family(name, Kind::Gauge, help);
    for (cg, f) in cgroups {
        out.sample(name, &[("cgroup", cg)], value(f));
    }
}

/// What the last complete pass found per cgroup.
fn cgroups(out: &mut Exposition, pass: &Pass) {
    let cg = &pass.cgroups;
    per_cgroup(out, "hugelab_cgroup_processes", "processes scanned in the memory cgroup and the cgroups below it (to --cgroup-depth) at the last scan", cg, |f| f.processes as f64);
    per_cgroup(
        out,
        "hugelab_cgroup_anon_bytes",
        &smaps_means("Anonymous"),
        cg,
        |f| f.anon_kb as f64 * KB,
    );
    per_cgroup(
        out,
        "hugelab_cgroup_anon_huge_pages_bytes",
        &smaps_means("AnonHugePages"),
        cg,
        |f| f.anon_huge_kb as f64 * KB,
    );
    per_cgroup(out, "hugelab_cgroup_unclassified_bytes", "present memory mapped by PTEs whose /proc/kpageflags read 0: neither THP nor base page can be told (not in the folio sizes)", cg, |f| f.unclassified_kb as f64 * KB);
    let name = "hugelab_cgroup_anon_folio_bytes";
    out.family(name, Kind::Gauge, "anonymous memory mapped from large folios of the size, PMD- or PTE-mapped, whole or partly (a THP two processes map counts for each)");
    for (c, f) in cg {
        for (kb, v) in &f.large_kb {
            let size = format!("{kb}kB");
            out.sample(name, &[("cgroup", c), ("size", &size)], *v as f64 * KB);
        }
    }
    histogram(out, cg);
    give_back(out, pass);
}

/// The seed-004 histogram per cgroup and folio size.
fn histogram(out: &mut Exposition, cg: &BTreeMap<String, CgroupFigures>) {
    let folios = "hugelab_cgroup_thp_utilization_folios";
    let zero = "hugelab_cgroup_thp_utilization_zero_filled_bytes";
    for (name, help) in [
        (folios, "fully mapped anonymous large folios whose subpages in use (not zero-filled) are in the bucket `used` (the seed-004 THP utilization histogram, 10 buckets)"),
        (zero, "zero-filled memory in the fully mapped anonymous large folios of the bucket `used` (the seed-004 THP utilization histogram)"),
    ] {
        out.family(name, Kind::Gauge, help);
        for (c, f) in cg {
            for (kb, buckets) in &f.histogram {
                let size = format!("{kb}kB");
                for b in buckets {
                    let used = format!("{}-{}", b.lo, b.hi);
                    let labels = [("cgroup", c.as_str()), ("size", &size), ("used", &used)];
                    let v = if name == folios {
                        b.folios as f64
                    } else {
                        b.zero_pages as f64 * hugelab_workload::units::PAGE_KB as f64 * KB
                    };
                    out.sample(name, &labels, v);
                }
            }
        }
    }
}

type GiveBackFigure = fn(&hugelab_workload::utilization::GiveBack) -> f64;

/// The deferred split shrinker's give-back per cgroup, at the machine's
/// settings and at the recommended ones.
fn give_back(out: &mut Exposition, pass: &Pass) {
    let p = &pass.predictions;
    let at = [
        ("machine", p.machine.max_ptes_none.to_string()),
        ("recommended", p.recommended.max_ptes_none.to_string()),
    ];
    let families: [(&str, &str, GiveBackFigure); 2] = [
        ("hugelab_cgroup_shrinker_give_back_bytes", "memory the deferred split shrinker would free (zero-filled subpages of the THPs it would split, and the unmapped subpages of partially mapped ones), at the machine's settings or the recommended ones (shrink_underused 1, max_ptes_none 409)", |g| g.freed_kb() as f64 * KB),
        ("hugelab_cgroup_shrinker_rss_drop_bytes", "how much the cgroup's processes' Rss would drop when the deferred split shrinker remaps the zero-filled subpages to the zero page, at the settings `at`", |g| g.rss_kb as f64 * KB),
    ];
    for (name, help, value) in families {
        out.family(name, Kind::Gauge, help);
        for (c, f) in &pass.cgroups {
            for ((setting, n), g) in at.iter().zip([&f.machine, &f.recommended]) {
                let labels = [
                    ("cgroup", c.as_str()),
                    ("at", setting),
                    ("max_ptes_none", n),
                ];
                out.sample(name, &labels, value(g));
            }
        }
    }
}

/// The exporter's own cost.
fn cost(out: &mut Exposition, pass: Option<&Pass>, state: ScanState, budget: f64) {
    out.single(
        "hugelab_exporter_cpu_seconds_total",
        Kind::Counter,
        "CPU time the exporter used since it started, every thread (scans and scrapes)",
        super::scan_loop::cpu_time().as_secs_f64(),
    );
    out.single(
        "hugelab_exporter_cpu_budget_ratio",
        Kind::Gauge,
        "the CPU time the exporter may use per second of a scan (--cpu-budget)",
        budget,
    );
    out.single(
        "hugelab_exporter_scans_total",
        Kind::Counter,
        "complete scans of every process's page contents since the exporter started",
        state.passes as f64,
    );
    out.single(
        "hugelab_exporter_scan_running",
        Kind::Gauge,
        "1 while a scan runs (the figures served are the last complete scan's), 0 while it waits for the next interval",
        f64::from(u8::from(state.running)),
    );
    let Some(pass) = pass else {
        return;
    };
    let c: &Cost = &pass.cost;
    let since_epoch = pass.finished.duration_since(UNIX_EPOCH).unwrap_or_default();
    for (name, help, v) in [
        ("hugelab_exporter_scan_age_seconds", "time since the last complete scan ended: the age of every hugelab_cgroup_ figure", pass.finished_at.elapsed().as_secs_f64()),
        ("hugelab_exporter_scan_timestamp_seconds", "when the last complete scan ended, Unix time", since_epoch.as_secs_f64()),
        ("hugelab_exporter_scan_duration_seconds", "how long the last complete scan took, its waits for the CPU budget included", c.wall.as_secs_f64()),
        ("hugelab_exporter_scan_cpu_seconds", "CPU time the exporter used during the last complete scan", c.cpu.as_secs_f64()),
        ("hugelab_exporter_scan_wait_seconds", "how long the last complete scan waited to keep within the CPU budget", c.waited.as_secs_f64()),
        ("hugelab_exporter_scan_pages_read", "pages of anonymous large folios whose content the last complete scan read", c.pages_read as f64),
        ("hugelab_exporter_scan_processes", "processes the last complete scan read (kernel threads have no memory and are not counted)", c.scanned as f64),
    ] {
        out.single(name, Kind::Gauge, help, v);
    }
    let name = "hugelab_exporter_scan_skipped_processes";
    out.family(name, Kind::Gauge, "processes the last complete scan could not read, by reason: exited (before or during their scan), denied (the kernel refused), error (named on the exporter's stderr)");
    for s in Skip::ALL {
        let n = c.skipped.get(&s).copied().unwrap_or(0);
        out.sample(name, &[("reason", s.name())], n as f64);
    }
}

/// Where the scanner thread is.
#[derive(Clone, Copy, Debug)]
pub struct ScanState {
    /// Complete passes so far.
    pub passes: u64,
    /// A pass is running.
    pub running: bool,
}

/// The whole exposition: the machine's counters as just read, the last
/// complete pass (none before the first ends) and the exporter's cost.
pub fn render(read: &Counters, pass: Option<&Pass>, state: ScanState, budget: f64) -> String {
    let mut out = Exposition::default();
    machine(&mut out, read);
    if let Some(p) = pass {
        cgroups(&mut out, p);
    }
    cost(&mut out, pass, state, budget);
    out.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(name: &str) -> Metric {
        let c = counters::lookup(name).unwrap();
        registry_metric(c.family, c.field)
    }

    #[test]
    fn registry_fields_keep_their_kernel_names_types_and_units() {
        let m = metric("vmstat.thp_fault_alloc");
        assert_eq!(m.name, "hugelab_vmstat_thp_fault_alloc_total");
        assert_eq!(m.kind, Kind::Counter);
        assert!(
            m.help.ends_with("(kernel: /proc/vmstat thp_fault_alloc)"),
            "{}",
            m.help
        );
        let m = metric("mthp.64kB.nr_anon");
        assert_eq!(
            (m.name.as_str(), m.kind),
            ("hugelab_mthp_nr_anon_folios", Kind::Gauge)
        );
        assert!(
            m.help.contains("hugepages-<size>/stats/nr_anon)"),
            "{}",
            m.help
        );
        assert_eq!(
            metric("vmstat.nr_memmap_pages").name,
            "hugelab_vmstat_nr_memmap_pages"
        );
        assert_eq!(
            metric("vmstat.nr_anon_transparent_hugepages").name,
            "hugelab_vmstat_nr_anon_transparent_hugepages"
        );
        assert_eq!(
            metric("hugetlb.2048kB.free_hugepages").name,
            "hugelab_hugetlb_free_hugepages"
        );
        assert_eq!(
            metric("khugepaged.full_scans").name,
            "hugelab_khugepaged_full_scans_total"
        );
        let m = metric("meminfo.AnonHugePages");
        assert_eq!(
            (m.name.as_str(), m.scale),
            ("hugelab_meminfo_AnonHugePages_bytes", 1024.0)
        );
    }

    #[test]
    fn the_machine_counters_are_grouped_by_field_with_a_size_label() {
        let read: Counters = [
            ("mthp.64kB.anon_fault_alloc", 3),
            ("mthp.2048kB.anon_fault_alloc", 5),
            ("vmstat.thp_split_pmd", 7),
            ("vmstat.pgfault", 9),
            ("meminfo.AnonHugePages", 11),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let mut out = Exposition::default();
        machine(&mut out, &read);
        let text = out.finish();
        assert!(
            text.contains("hugelab_vmstat_thp_split_pmd_total 7\n"),
            "{text}"
        );
        assert!(
            text.contains("hugelab_mthp_anon_fault_alloc_total{size=\"64kB\"} 3\nhugelab_mthp_anon_fault_alloc_total{size=\"2048kB\"} 5\n"),
            "{text}"
        );
        // Not huge-page counters: node_exporter's.
        assert!(
            !text.contains("pgfault") && !text.contains("meminfo"),
            "{text}"
        );
        assert_eq!(
            text.matches("# TYPE hugelab_mthp_anon_fault_alloc_total counter")
                .count(),
            1
        );
    }

    #[test]
    fn help_and_label_values_are_escaped() {
        let mut out = Exposition::default();
        out.family("x", Kind::Gauge, "a\\b\nc");
        out.sample("x", &[("cgroup", "/a\"b\\c")], 1.5);
        assert_eq!(
            out.finish(),
            "# HELP x a\\\\b\\nc\n# TYPE x gauge\nx{cgroup=\"/a\\\"b\\\\c\"} 1.5\n"
        );
    }
}
