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
use crate::parse::{parse_decimal, quote};
use std::str::FromStr;

/// The accepted tunable paths, for the "unknown tunable" message.
const TUNABLE_FORMS: &str = "transparent_hugepage/{enabled,defrag,use_zero_page,shrink_underused,anon_beside_full}, \
transparent_hugepage/hugepages-<N>kB/enabled, \
transparent_hugepage/khugepaged/{defrag,max_ptes_none,max_ptes_swap,max_ptes_shared,pages_to_scan,scan_sleep_millisecs,alloc_sleep_millisecs}, \
hugepages/hugepages-<N>kB/{nr_hugepages,nr_overcommit_hugepages}, \
vm.{hugetlb_optimize_vmemmap,nr_hugepages,nr_overcommit_hugepages,overcommit_memory,compaction_proactiveness,min_free_kbytes}";

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
    /// /proc/sys/vm/<name>); the error message lists the accepted forms.
    fn from_str(s: &str) -> Result<Tunable, String> {
        let unknown = || {
            format!(
                "unknown tunable {}; expected one of {TUNABLE_FORMS}",
                quote(s)
            )
        };
        if let Some(name) = s.strip_prefix("vm.") {
            return word(&VmSysctl::ALL, VmSysctl::name, name)
                .map(Tunable::Sysctl)
                .ok_or_else(unknown);
        }
        if let Some(rest) = s.strip_prefix("transparent_hugepage/") {
            match rest {
                "enabled" => return Ok(Tunable::ThpEnabled),
                "defrag" => return Ok(Tunable::ThpDefrag),
                "use_zero_page" => return Ok(Tunable::ThpUseZeroPage),
                "shrink_underused" => return Ok(Tunable::ThpShrinkUnderused),
                "anon_beside_full" => return Ok(Tunable::ThpAnonBesideFull),
                _ => {}
            }
            if let Some(knob) = rest.strip_prefix("khugepaged/") {
                return word(&KhugepagedKnob::ALL, KhugepagedKnob::name, knob)
                    .map(Tunable::Khugepaged)
                    .ok_or_else(unknown);
            }
            return match sized_dir(rest) {
                Some(Ok((size_kb, "enabled"))) => Ok(Tunable::ThpSizeEnabled { size_kb }),
                Some(Err(m)) => Err(m),
                _ => Err(unknown()),
            };
        }
        if let Some(rest) = s.strip_prefix("hugepages/") {
            return match sized_dir(rest) {
                Some(Ok((size_kb, "nr_hugepages"))) => Ok(Tunable::HugetlbNrHugepages { size_kb }),
                Some(Ok((size_kb, "nr_overcommit_hugepages"))) => {
                    Ok(Tunable::HugetlbNrOvercommit { size_kb })
                }
                Some(Err(m)) => Err(m),
                _ => Err(unknown()),
            };
        }
        Err(unknown())
    }
}

/// What values a tunable accepts; used both to parse and to check a value.
enum Accepts {
    Enabled,
    SizeEnabled,
    Defrag,
    /// An integer in this inclusive range.
    Num(u64, u64),
}

impl Tunable {
    fn accepts(&self) -> Accepts {
        match self {
            Tunable::ThpEnabled => Accepts::Enabled,
            Tunable::ThpSizeEnabled { .. } => Accepts::SizeEnabled,
            Tunable::ThpDefrag => Accepts::Defrag,
            // Flags the kernel stores as 0/1 and rejects anything else.
            Tunable::ThpUseZeroPage
            | Tunable::ThpShrinkUnderused
            | Tunable::ThpAnonBesideFull
            | Tunable::Khugepaged(KhugepagedKnob::Defrag)
            | Tunable::Sysctl(VmSysctl::HugetlbOptimizeVmemmap) => Accepts::Num(0, 1),
            // khugepaged refuses to scan zero pages per pass (EINVAL).
            Tunable::Khugepaged(KhugepagedKnob::PagesToScan) => Accepts::Num(1, u64::MAX),
            // The kernel's sysctl bounds (proc_dointvec_minmax).
            Tunable::Sysctl(VmSysctl::OvercommitMemory) => Accepts::Num(0, 2),
            Tunable::Sysctl(VmSysctl::CompactionProactiveness) => Accepts::Num(0, 100),
            _ => Accepts::Num(0, u64::MAX),
        }
    }

    /// Whether `value` is one this tunable accepts (for ASTs not built by the parser).
    pub fn accepts_value(&self, value: &SetValue) -> bool {
        match (self.accepts(), value) {
            (Accepts::Enabled, SetValue::Enabled(_)) => true,
            (Accepts::SizeEnabled, SetValue::SizeEnabled(_)) => true,
            (Accepts::Defrag, SetValue::Defrag(_)) => true,
            (Accepts::Num(lo, hi), SetValue::Num(n)) => (lo..=hi).contains(n),
            _ => false,
        }
    }

    /// Parses a value as this tunable accepts it (the words its sysfs file
    /// takes, or a decimal number), naming the accepted values on error.
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
            Accepts::Num(lo, hi) => {
                let expected = match (lo, hi) {
                    (0, 1) => "0 or 1".to_string(),
                    (0, u64::MAX) => "a non-negative integer".to_string(),
                    (1, u64::MAX) => "a positive integer".to_string(),
                    _ => format!("an integer from {lo} to {hi}"),
                };
                match parse_decimal(v) {
                    Some(Some(n)) if (lo..=hi).contains(&n) => Ok(SetValue::Num(n)),
                    Some(None) if hi == u64::MAX => Err(format!("value too large: {}", quote(v))),
                    _ => Err(bad(&expected)),
                }
            }
        }
    }
}
