//! The tunable vocabulary: which sysfs and sysctl files a workload's `set`
//! can name, and which values each of them takes.
//!
//! Paths are the kernel's own, relative to /sys/kernel/mm/ for the THP and
//! hugetlb files (`transparent_hugepage/enabled`,
//! `transparent_hugepage/hugepages-64kB/enabled`,
//! `transparent_hugepage/khugepaged/max_ptes_none`,
//! `hugepages/hugepages-2048kB/nr_hugepages`) and written `vm.<name>` for
//! `/proc/sys/vm/<name>`. Values are the words the file takes (`always`,
//! `defer+madvise`) or a decimal number within the kernel's bounds. The
//! parser (`set`), the checker (ASTs not built by the parser), `hugelab diff`
//! (reading the machine's values back) and the kernel backend (which files to
//! journal) all go through this module; the enums themselves are in
//! [`crate::ast`].

use crate::ast::*;
use crate::errno::Errno;
use crate::text::{parse_decimal, quote};
use std::str::FromStr;

/// The accepted tunable paths, by family, for the "unknown tunable" message.
const TUNABLE_FORMS: [&str; 5] = [
    "transparent_hugepage/{enabled,defrag,use_zero_page,shrink_underused,anon_beside_full}",
    "transparent_hugepage/hugepages-<N>kB/enabled",
    "transparent_hugepage/khugepaged/{defrag,max_ptes_none,max_ptes_swap,max_ptes_shared,pages_to_scan,scan_sleep_millisecs,alloc_sleep_millisecs}",
    "hugepages/hugepages-<N>kB/{nr_hugepages,nr_overcommit_hugepages}",
    "vm.{hugetlb_optimize_vmemmap,nr_hugepages,nr_overcommit_hugepages,overcommit_memory,compaction_proactiveness,min_free_kbytes}",
];

/// The largest value of `khugepaged/max_ptes_{none,swap,shared}`:
/// HPAGE_PMD_NR - 1, above which their store functions (mm/khugepaged.c)
/// refuse the write with EINVAL.
pub const MAX_PTES_LIMIT: u64 = crate::units::HPAGE_PMD_NR - 1;

/// The directory the sysfs tunables' paths are relative to.
pub const SYS_MM: &str = "/sys/kernel/mm";
/// The directory of the `vm.<name>` sysctls.
pub const PROC_VM: &str = "/proc/sys/vm";

/// Linux 6.18's other writable files in /proc/sys/vm
/// (Documentation/admin-guide/sysctl/vm.rst) and in the THP and HugeTLB
/// sysfs directories (admin-guide/mm/transhuge.rst, hugetlbpage.rst): real
/// tunables that hugelab does not model, named as `set` would name them.
const NOT_MODELLED: &[&str] = &[
    "vm.admin_reserve_kbytes",
    "vm.compact_memory",
    "vm.compact_unevictable_allowed",
    "vm.defrag_mode",
    "vm.dirty_background_bytes",
    "vm.dirty_background_ratio",
    "vm.dirty_bytes",
    "vm.dirty_expire_centisecs",
    "vm.dirty_ratio",
    "vm.dirty_writeback_centisecs",
    "vm.dirtytime_expire_seconds",
    "vm.drop_caches",
    "vm.enable_soft_offline",
    "vm.extfrag_threshold",
    "vm.highmem_is_dirtyable",
    "vm.hugetlb_shm_group",
    "vm.laptop_mode",
    "vm.legacy_va_layout",
    "vm.lowmem_reserve_ratio",
    "vm.max_map_count",
    "vm.mem_profiling",
    "vm.memfd_noexec",
    "vm.memory_failure_early_kill",
    "vm.memory_failure_recovery",
    "vm.min_slab_ratio",
    "vm.min_unmapped_ratio",
    "vm.mmap_min_addr",
    "vm.mmap_rnd_bits",
    "vm.mmap_rnd_compat_bits",
    "vm.nr_hugepages_mempolicy",
    "vm.nr_trim_pages",
    "vm.numa_stat",
    "vm.numa_zonelist_order",
    "vm.oom_dump_tasks",
    "vm.oom_kill_allocating_task",
    "vm.overcommit_kbytes",
    "vm.overcommit_ratio",
    "vm.page-cluster",
    "vm.page_lock_unfairness",
    "vm.panic_on_oom",
    "vm.percpu_pagelist_high_fraction",
    "vm.stat_interval",
    "vm.stat_refresh",
    "vm.swappiness",
    "vm.unprivileged_userfaultfd",
    "vm.user_reserve_kbytes",
    "vm.vfs_cache_pressure",
    "vm.vfs_cache_pressure_denom",
    "vm.watermark_boost_factor",
    "vm.watermark_scale_factor",
    "vm.zone_reclaim_mode",
    "transparent_hugepage/shmem_enabled",
    "transparent_hugepage/hugepages-<N>kB/shmem_enabled",
    "hugepages/hugepages-<N>kB/nr_hugepages_mempolicy",
];

/// Read-only files beside the tunables: statistics, not settings.
const READ_ONLY: &[&str] = &[
    "transparent_hugepage/hpage_pmd_size",
    "transparent_hugepage/khugepaged/full_scans",
    "transparent_hugepage/khugepaged/pages_collapsed",
    "hugepages/hugepages-<N>kB/free_hugepages",
    "hugepages/hugepages-<N>kB/resv_hugepages",
    "hugepages/hugepages-<N>kB/surplus_hugepages",
];

impl Tunable {
    /// The tunable's path: relative to /sys/kernel/mm/ for sysfs files,
    /// `vm.<name>` for /proc/sys/vm/<name>. Exactly what `set` takes.
    pub fn path(&self) -> String {
        match self {
            Tunable::ThpEnabled => "transparent_hugepage/enabled".to_string(),
            Tunable::ThpDefrag => "transparent_hugepage/defrag".to_string(),
            Tunable::ThpUseZeroPage => "transparent_hugepage/use_zero_page".to_string(),
            Tunable::ThpShrinkUnderused => "transparent_hugepage/shrink_underused".to_string(),
            Tunable::ThpAnonBesideFull => "transparent_hugepage/anon_beside_full".to_string(),
            Tunable::ThpSizeEnabled { size_kb } => {
                format!("transparent_hugepage/hugepages-{size_kb}kB/enabled")
            }
            Tunable::Khugepaged(k) => format!("transparent_hugepage/khugepaged/{}", k.name()),
            Tunable::HugetlbNrHugepages { size_kb } => {
                format!("hugepages/hugepages-{size_kb}kB/nr_hugepages")
            }
            Tunable::HugetlbNrOvercommit { size_kb } => {
                format!("hugepages/hugepages-{size_kb}kB/nr_overcommit_hugepages")
            }
            Tunable::Sysctl(s) => format!("vm.{}", s.name()),
        }
    }
}

impl KhugepagedKnob {
    pub const ALL: [KhugepagedKnob; 7] = [
        KhugepagedKnob::Defrag,
        KhugepagedKnob::MaxPtesNone,
        KhugepagedKnob::MaxPtesSwap,
        KhugepagedKnob::MaxPtesShared,
        KhugepagedKnob::PagesToScan,
        KhugepagedKnob::ScanSleepMillisecs,
        KhugepagedKnob::AllocSleepMillisecs,
    ];

    /// The file name under transparent_hugepage/khugepaged/.
    pub fn name(self) -> &'static str {
        match self {
            KhugepagedKnob::Defrag => "defrag",
            KhugepagedKnob::MaxPtesNone => "max_ptes_none",
            KhugepagedKnob::MaxPtesSwap => "max_ptes_swap",
            KhugepagedKnob::MaxPtesShared => "max_ptes_shared",
            KhugepagedKnob::PagesToScan => "pages_to_scan",
            KhugepagedKnob::ScanSleepMillisecs => "scan_sleep_millisecs",
            KhugepagedKnob::AllocSleepMillisecs => "alloc_sleep_millisecs",
        }
    }
}

impl VmSysctl {
    pub const ALL: [VmSysctl; 6] = [
        VmSysctl::HugetlbOptimizeVmemmap,
        VmSysctl::NrHugepages,
        VmSysctl::NrOvercommitHugepages,
        VmSysctl::OvercommitMemory,
        VmSysctl::CompactionProactiveness,
        VmSysctl::MinFreeKbytes,
    ];

    /// The file name under /proc/sys/vm/.
    pub fn name(self) -> &'static str {
        match self {
            VmSysctl::HugetlbOptimizeVmemmap => "hugetlb_optimize_vmemmap",
            VmSysctl::NrHugepages => "nr_hugepages",
            VmSysctl::NrOvercommitHugepages => "nr_overcommit_hugepages",
            VmSysctl::OvercommitMemory => "overcommit_memory",
            VmSysctl::CompactionProactiveness => "compaction_proactiveness",
            VmSysctl::MinFreeKbytes => "min_free_kbytes",
        }
    }
}

impl ThpEnabled {
    /// Every value, in the order transparent_hugepage/enabled lists them.
    pub const ALL: [ThpEnabled; 3] = [ThpEnabled::Always, ThpEnabled::Madvise, ThpEnabled::Never];

    /// The word transparent_hugepage/enabled takes.
    pub fn name(self) -> &'static str {
        match self {
            ThpEnabled::Always => "always",
            ThpEnabled::Madvise => "madvise",
            ThpEnabled::Never => "never",
        }
    }
}

impl ThpSizeEnabled {
    /// Every value, in the order hugepages-<size>kB/enabled lists them.
    pub const ALL: [ThpSizeEnabled; 4] = [
        ThpSizeEnabled::Always,
        ThpSizeEnabled::Inherit,
        ThpSizeEnabled::Madvise,
        ThpSizeEnabled::Never,
    ];

    /// The word hugepages-<size>kB/enabled takes.
    pub fn name(self) -> &'static str {
        match self {
            ThpSizeEnabled::Always => "always",
            ThpSizeEnabled::Inherit => "inherit",
            ThpSizeEnabled::Madvise => "madvise",
            ThpSizeEnabled::Never => "never",
        }
    }

    /// The mode this size follows: its own, or with `inherit` the top-level
    /// `enabled` (mm/huge_memory.c: a size in `huge_anon_orders_inherit`
    /// is allowed as `hugepage_global_enabled()` and
    /// `hugepage_global_always()` say). Allowed at all: `!= Never`.
    pub fn resolve(self, enabled: ThpEnabled) -> ThpEnabled {
        match self {
            ThpSizeEnabled::Always => ThpEnabled::Always,
            ThpSizeEnabled::Madvise => ThpEnabled::Madvise,
            ThpSizeEnabled::Never => ThpEnabled::Never,
            ThpSizeEnabled::Inherit => enabled,
        }
    }
}

impl ThpDefrag {
    /// Every value, in the order transparent_hugepage/defrag lists them.
    pub const ALL: [ThpDefrag; 5] = [
        ThpDefrag::Always,
        ThpDefrag::Defer,
        ThpDefrag::DeferMadvise,
        ThpDefrag::Madvise,
        ThpDefrag::Never,
    ];

    /// The word transparent_hugepage/defrag takes.
    pub fn name(self) -> &'static str {
        match self {
            ThpDefrag::Always => "always",
            ThpDefrag::Defer => "defer",
            ThpDefrag::DeferMadvise => "defer+madvise",
            ThpDefrag::Madvise => "madvise",
            ThpDefrag::Never => "never",
        }
    }
}

/// The member of `all` whose name is `v`.
fn word<T: Copy>(all: &[T], name: fn(T) -> &'static str, v: &str) -> Option<T> {
    all.iter().copied().find(|x| name(*x) == v)
}

/// `one of a, b, c`: the accepted words, for an error message.
fn one_of<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> String {
    let names: Vec<&str> = all.iter().map(|x| name(*x)).collect();
    format!("one of {}", names.join(", "))
}

/// Parses `hugepages-<N>kB` followed by `/`, returning N and the rest after the `/`.
/// `Err` when the shape matches but N is not a power of two of at least 8.
fn sized_dir(s: &str) -> Option<Result<(u64, &str), String>> {
    let rest = s.strip_prefix("hugepages-")?;
    let (n, rest) = rest.split_once("kB/")?;
    let kb = parse_decimal(n)?;
    match kb {
        Some(kb) if kb >= 8 && kb.is_power_of_two() => Some(Ok((kb, rest))),
        _ => Some(Err(format!(
            "bad page size in hugepages-{n}kB; expected a power of two of at least 8 (kB), like hugepages-64kB"
        ))),
    }
}

impl FromStr for Tunable {
    type Err = String;

    /// A tunable by its path (relative to /sys/kernel/mm/, or `vm.<name>` for
    /// /proc/sys/vm/<name>), or by its whole file path (a pasted
    /// `/sys/kernel/mm/transparent_hugepage/enabled` is
    /// `transparent_hugepage/enabled`). The error suggests the nearest
    /// tunable, says when the name is a kernel file hugelab does not model,
    /// or lists the accepted forms.
    fn from_str(s: &str) -> Result<Tunable, String> {
        let under = |dir: &str| s.strip_prefix(dir).and_then(|r| r.strip_prefix('/'));
        let name = if let Some(rest) = under(SYS_MM) {
            rest.to_string()
        } else if let Some(rest) = under(PROC_VM) {
            format!("vm.{rest}")
        } else {
            s.to_string()
        };
        parse_name(&name)?.ok_or_else(|| unknown_tunable(s, &name))
    }
}

/// `Ok(None)` when `s` names no tunable; `Err` for a tunable directory of a
/// size that cannot be a page size.
fn parse_name(s: &str) -> Result<Option<Tunable>, String> {
    if let Some(name) = s.strip_prefix("vm.") {
        return Ok(word(&VmSysctl::ALL, VmSysctl::name, name).map(Tunable::Sysctl));
    }
    if let Some(rest) = s.strip_prefix("transparent_hugepage/") {
        match rest {
            "enabled" => return Ok(Some(Tunable::ThpEnabled)),
            "defrag" => return Ok(Some(Tunable::ThpDefrag)),
            "use_zero_page" => return Ok(Some(Tunable::ThpUseZeroPage)),
            "shrink_underused" => return Ok(Some(Tunable::ThpShrinkUnderused)),
            "anon_beside_full" => return Ok(Some(Tunable::ThpAnonBesideFull)),
            _ => {}
        }
        if let Some(knob) = rest.strip_prefix("khugepaged/") {
            return Ok(
                word(&KhugepagedKnob::ALL, KhugepagedKnob::name, knob).map(Tunable::Khugepaged)
            );
        }
        return match sized_dir(rest) {
            Some(Ok((size_kb, "enabled"))) => Ok(Some(Tunable::ThpSizeEnabled { size_kb })),
            Some(Err(m)) => Err(m),
            _ => Ok(None),
        };
    }
    if let Some(rest) = s.strip_prefix("hugepages/") {
        return match sized_dir(rest) {
            Some(Ok((size_kb, "nr_hugepages"))) => {
                Ok(Some(Tunable::HugetlbNrHugepages { size_kb }))
            }
            Some(Ok((size_kb, "nr_overcommit_hugepages"))) => {
                Ok(Some(Tunable::HugetlbNrOvercommit { size_kb }))
            }
            Some(Err(m)) => Err(m),
            _ => Ok(None),
        };
    }
    Ok(None)
}

/// Every tunable, in a stable order: the THP global files, a per-size
/// `enabled` for each of `thp_sizes_kb`, khugepaged's, the two files of the
/// HugeTLB pool of each of `hugetlb_sizes_kb`, the vm sysctls. The kernel
/// backend lists a machine's with the sizes it has (and keeps the files
/// that exist); the typo check, with the size the name asked for.
pub fn every_tunable(thp_sizes_kb: &[u64], hugetlb_sizes_kb: &[u64]) -> Vec<Tunable> {
    let mut all = vec![
        Tunable::ThpEnabled,
        Tunable::ThpDefrag,
        Tunable::ThpUseZeroPage,
        Tunable::ThpShrinkUnderused,
        Tunable::ThpAnonBesideFull,
    ];
    all.extend(
        thp_sizes_kb
            .iter()
            .map(|&size_kb| Tunable::ThpSizeEnabled { size_kb }),
    );
    all.extend(KhugepagedKnob::ALL.map(Tunable::Khugepaged));
    for &size_kb in hugetlb_sizes_kb {
        all.push(Tunable::HugetlbNrHugepages { size_kb });
        all.push(Tunable::HugetlbNrOvercommit { size_kb });
    }
    all.extend(VmSysctl::ALL.map(Tunable::Sysctl));
    all
}

/// `name` with the size of its `hugepages-<size>` directory written as the
/// kernel writes it (`hugepages-64K` → `hugepages-64kB`), and that size in
/// kB when it can be a page size.
fn kernel_size_spelling(name: &str) -> (String, Option<u64>) {
    const DIR: &str = "hugepages-";
    let Some(at) = name.rfind(DIR).map(|i| i + DIR.len()) else {
        return (name.to_string(), None);
    };
    let end = name[at..].find('/').map_or(name.len(), |i| at + i);
    let kb = match crate::units::parse_size(&name[at..end]) {
        Ok(bytes) if bytes % 1024 == 0 && (bytes >> 10) >= 8 && bytes.is_power_of_two() => {
            bytes >> 10
        }
        _ => return (name.to_string(), None),
    };
    (format!("{}{kb}kB{}", &name[..at], &name[end..]), Some(kb))
}

/// Why `s` (`name` once a pasted path is mapped) is not a tunable: the
/// nearest one when it looks like a typo, a kernel file hugelab does not
/// model, or the accepted forms.
fn unknown_tunable(s: &str, name: &str) -> String {
    let (spelled, size_kb) = kernel_size_spelling(name);
    // As the family lists write it: the size a placeholder.
    let shape = match size_kb {
        Some(kb) => spelled.replace(&format!("hugepages-{kb}kB"), "hugepages-<N>kB"),
        None => spelled.clone(),
    };
    let as_sysctl = format!("vm.{shape}");
    let named = |real: &str| {
        if real == s {
            quote(s)
        } else {
            format!("{} ({real})", quote(s))
        }
    };
    for (list, what) in [
        (NOT_MODELLED, "a kernel tunable hugelab does not model"),
        (READ_ONLY, "a read-only kernel statistic, not a tunable"),
    ] {
        let real = [&shape, &as_sysctl]
            .into_iter()
            .find(|n| list.contains(&n.as_str()));
        if let Some(real) = real {
            let real = real.replace(
                "hugepages-<N>kB",
                &format!("hugepages-{}kB", size_kb.unwrap_or(0)),
            );
            let family = family_of(&real);
            let forms: Vec<&str> = TUNABLE_FORMS
                .iter()
                .copied()
                .filter(|f| family_of(f) == family)
                .collect();
            // One form is short enough to say; the THP family's three are
            // the long list this message exists to avoid.
            let models = match forms.as_slice() {
                [one] => format!("the {family} tunables it models are {one}"),
                _ => format!("`set` in docs/language.md lists the {family} tunables it models"),
            };
            return format!("{} is {what}; {models}", named(&real));
        }
    }
    // The per-size ones at the size asked for (64kB THPs and 2048kB HugeTLB
    // pages when none).
    let (thp, hugetlb) = (size_kb.unwrap_or(64), size_kb.unwrap_or(2048));
    let known: Vec<String> = every_tunable(&[thp], &[hugetlb])
        .iter()
        .map(Tunable::path)
        .collect();
    let nearest = known
        .iter()
        .map(|k| (crate::counters::distance(&spelled, k), k))
        .min_by_key(|(cost, _)| *cost)
        .filter(|(cost, k)| {
            // A third of what differs, not of the whole path: `colour` is
            // no typo of `defrag` for sharing `transparent_hugepage/`.
            let same = common_dirs(&spelled, k);
            k.as_str() != name && crate::counters::is_typo(*cost, &spelled[same..])
        });
    let guesses: Vec<&String> = match nearest {
        Some((_, k)) => vec![k],
        // The end of a tunable's name: `hugepages-64kB/enabled`, `nr_hugepages`.
        None => known
            .iter()
            .filter(|k| {
                k.strip_suffix(spelled.as_str())
                    .is_some_and(|head| head.ends_with('/') || head.ends_with('.'))
            })
            .collect(),
    };
    match guesses.as_slice() {
        [] => format!(
            "unknown tunable {}; expected one of {}",
            quote(s),
            TUNABLE_FORMS.join(", ")
        ),
        [one] => format!("unknown tunable {}; did you mean {one}?", quote(s)),
        several => {
            let names: Vec<&str> = several.iter().map(|k| k.as_str()).collect();
            format!(
                "unknown tunable {}; did you mean {}?",
                quote(s),
                names.join(" or ")
            )
        }
    }
}

/// The length of the directories (`transparent_hugepage/`, `vm.`) `a` and
/// `b` begin with alike.
fn common_dirs(a: &str, b: &str) -> usize {
    a.char_indices()
        .zip(b.chars())
        .take_while(|((_, x), y)| x == y)
        .filter(|((_, x), _)| matches!(x, '/' | '.'))
        .last()
        .map_or(0, |((i, _), _)| i + 1)
}

/// `vm.`, `transparent_hugepage/` or `hugepages/`: where a tunable lives.
fn family_of(name: &str) -> &str {
    match name.find(['/', '.']) {
        Some(i) => &name[..=i],
        None => name,
    }
}

/// What values a tunable accepts; used both to parse and to check a value.
enum Accepts {
    Enabled,
    SizeEnabled,
    Defrag,
    /// An integer in this inclusive range, and the errno the kernel's
    /// store function gives any other value, where known.
    Num(u64, u64, Option<Errno>),
}

impl Tunable {
    /// The bounds are those of the kernel's store functions (Linux 6.18):
    /// mm/khugepaged.c `max_ptes_{none,swap,shared}_store` (kstrtoul, above
    /// HPAGE_PMD_NR - 1: EINVAL), `pages_to_scan_store` (kstrtouint, 0:
    /// EINVAL), `{scan,alloc}_sleep_millisecs_store` (kstrtouint),
    /// mm/huge_memory.c `single_hugepage_flag_store` (0 or 1), the sysctls'
    /// `proc_dointvec_minmax`; every refusal there is EINVAL.
    fn accepts(&self) -> Accepts {
        const UINT_MAX: u64 = u32::MAX as u64;
        let einval = Some(Errno::EINVAL);
        match self {
            Tunable::ThpEnabled => Accepts::Enabled,
            Tunable::ThpSizeEnabled { .. } => Accepts::SizeEnabled,
            Tunable::ThpDefrag => Accepts::Defrag,
            // Flags the kernel stores as 0/1 and rejects anything else.
            Tunable::ThpUseZeroPage
            | Tunable::ThpShrinkUnderused
            | Tunable::Khugepaged(KhugepagedKnob::Defrag) => Accepts::Num(0, 1, einval),
            // A vendor knob and a proc_dobool sysctl: 0 or 1 as hugelab
            // models them; what the kernel does with others is not checked.
            Tunable::ThpAnonBesideFull | Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap) => {
                Accepts::Num(0, 1, None)
            }
            Tunable::Khugepaged(
                KhugepagedKnob::MaxPtesNone
                | KhugepagedKnob::MaxPtesSwap
                | KhugepagedKnob::MaxPtesShared,
            ) => Accepts::Num(0, MAX_PTES_LIMIT, einval),
            // khugepaged refuses to scan zero pages per pass.
            Tunable::Khugepaged(KhugepagedKnob::PagesToScan) => Accepts::Num(1, UINT_MAX, einval),
            Tunable::Khugepaged(
                KhugepagedKnob::ScanSleepMillisecs | KhugepagedKnob::AllocSleepMillisecs,
            ) => Accepts::Num(0, UINT_MAX, einval),
            // The kernel's sysctl bounds (proc_dointvec_minmax).
            Tunable::Sysctl(VmSysctl::OvercommitMemory) => Accepts::Num(0, 2, einval),
            Tunable::Sysctl(VmSysctl::CompactionProactiveness) => Accepts::Num(0, 100, einval),
            _ => Accepts::Num(0, u64::MAX, None),
        }
    }

    /// `Ok` when `value` is one this tunable accepts; else why not, naming
    /// the accepted values and, for a number the kernel's store refuses, its
    /// errno (for ASTs not built by the parser, which checks as it parses).
    pub fn check_value(&self, value: &SetValue) -> Result<(), String> {
        match (self.accepts(), value) {
            (Accepts::Enabled, SetValue::Enabled(_)) => Ok(()),
            (Accepts::SizeEnabled, SetValue::SizeEnabled(_)) => Ok(()),
            (Accepts::Defrag, SetValue::Defrag(_)) => Ok(()),
            (Accepts::Num(lo, hi, _), SetValue::Num(n)) if (lo..=hi).contains(n) => Ok(()),
            (Accepts::Num(lo, hi, errno), SetValue::Num(_)) => Err(format!(
                "bad value {value} for {}; expected {}{}",
                self.path(),
                expected_num(lo, hi),
                refused_with(errno)
            )),
            _ => Err(format!("bad value {value} for {}", self.path())),
        }
    }

    /// Parses a value as this tunable accepts it (the words its sysfs file
    /// takes, or a decimal number), naming the accepted values on error and
    /// the errno the kernel's store would refuse it with.
    pub fn parse_value(&self, v: &str) -> Result<SetValue, String> {
        let bad = |expected: &str| {
            format!(
                "bad value {} for {}; expected {expected}",
                quote(v),
                self.path()
            )
        };
        match self.accepts() {
            Accepts::Enabled => word(&ThpEnabled::ALL, ThpEnabled::name, v)
                .map(SetValue::Enabled)
                .ok_or_else(|| bad(&one_of(&ThpEnabled::ALL, ThpEnabled::name))),
            Accepts::SizeEnabled => word(&ThpSizeEnabled::ALL, ThpSizeEnabled::name, v)
                .map(SetValue::SizeEnabled)
                .ok_or_else(|| bad(&one_of(&ThpSizeEnabled::ALL, ThpSizeEnabled::name))),
            Accepts::Defrag => word(&ThpDefrag::ALL, ThpDefrag::name, v)
                .map(SetValue::Defrag)
                .ok_or_else(|| bad(&one_of(&ThpDefrag::ALL, ThpDefrag::name))),
            Accepts::Num(lo, hi, errno) => match parse_decimal(v) {
                Some(Some(n)) if (lo..=hi).contains(&n) => Ok(SetValue::Num(n)),
                Some(None) if hi == u64::MAX => Err(format!("value too large: {}", quote(v))),
                _ => Err(bad(&format!(
                    "{}{}",
                    expected_num(lo, hi),
                    refused_with(errno)
                ))),
            },
        }
    }
}

/// The integers `lo..=hi`, in words.
fn expected_num(lo: u64, hi: u64) -> String {
    match (lo, hi) {
        (0, 1) => "0 or 1".to_string(),
        (0, u64::MAX) => "a non-negative integer".to_string(),
        (1, u64::MAX) => "a positive integer".to_string(),
        (1, hi) => format!("a positive integer up to {hi}"),
        _ => format!("an integer from {lo} to {hi}"),
    }
}

/// `: the kernel refuses it with EINVAL`, when the errno is known.
fn refused_with(errno: Option<Errno>) -> String {
    errno.map_or(String::new(), |e| {
        format!(": the kernel refuses it with {e}")
    })
}
