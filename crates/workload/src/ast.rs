//! The typed syntax tree of a workload (`.hlw`), as docs/language.md describes it.
//!
//! Every statement keeps the line and column it came from, so a backend that
//! refuses or fails a statement can point at it (`buf.hlw:7:12: ...`).

pub use crate::errno::Errno;
pub use crate::signal::Signal;
use std::fmt;

/// A whole workload: its statements in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The name the workload was read from, as given by the user (used in errors).
    pub file: String,
    pub stmts: Vec<Stmt>,
}

/// Where a statement or token starts: 1-based line and column.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Pos {
    pub line: u32,
    pub col: u32,
}

impl fmt::Display for Pos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.col)
    }
}

/// One statement with its position. Equality ignores nothing: two ASTs are equal
/// only if statements sit at the same places too (the round-trip test compares
/// `kind`s, since printing canonicalises spacing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stmt {
    pub pos: Pos,
    pub kind: StmtKind,
}

/// A name of a process, region, cgroup or snapshot: `[A-Za-z_][A-Za-z0-9_-]*`.
pub type Name = String;

/// A byte count. Printed with the largest binary suffix that divides it exactly.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Size(pub u64);

impl Size {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// `<region>[+<offset>][:<length>]`: a byte range of a region, relative to its start.
/// A missing offset is 0; a missing length runs to the region's end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Range {
    pub region: Name,
    pub offset: Option<Size>,
    pub len: Option<Size>,
}

impl Range {
    /// The absolute `[start, end)` of this range in a region at `start` of
    /// `len` bytes; an error sentence when it leaves the region.
    pub fn resolve(&self, start: u64, len: u64) -> Result<(u64, u64), String> {
        let offset = self.offset.map_or(0, |s| s.bytes());
        let n = self.len.map_or(len.saturating_sub(offset), |s| s.bytes());
        match offset.checked_add(n) {
            Some(end) if end <= len => Ok((start + offset, start + end)),
            _ => Err(format!(
                "range {offset:#x}+{n:#x} is outside region '{}' ({len:#x} bytes)",
                self.region
            )),
        }
    }
}

/// Page protection for `mmap prot=` and `mprotect`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prot {
    ReadWrite,
    Read,
    None,
}

/// `madvise` advice, by the kernel's MADV_ names without the prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advice {
    Hugepage,
    NoHugepage,
    DontNeed,
    Free,
    Collapse,
    Pageout,
    Cold,
}

/// The hugetlb page size of a `mmap ... hugetlb=` region.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HugetlbSize {
    Size2M,
    Size1G,
}

/// `expect` comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CmpOp {
    Eq,
    Le,
    Ge,
}

/// `machine` keys (model-only machine shape).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MachineParam {
    /// `arch=x86_64|arm64`
    Arch(Arch),
    /// `base_page=4K|16K|64K`
    BasePage(Size),
    /// `memory=16G`
    Memory(Size),
    /// `hvo=6.18|2021`: how many vmemmap pages HVO keeps per HugeTLB page.
    Hvo(HvoRuleName),
    /// `struct_page=64`: sizeof(struct page), in bytes.
    StructPage(u64),
}

/// The HVO rule a `machine hvo=` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HvoRuleName {
    /// Linux 6.18: one vmemmap page kept.
    Linux618,
    /// The 2021 series (Linux 5.14): two kept.
    Series2021,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Arm64,
}

/// A kernel tunable, by its own path. THP and hugetlb files are relative to
/// /sys/kernel/mm/; sysctls are /proc/sys/vm/<name> written `vm.<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tunable {
    /// transparent_hugepage/enabled: always|madvise|never
    ThpEnabled,
    /// transparent_hugepage/defrag: always|defer|defer+madvise|madvise|never
    ThpDefrag,
    /// transparent_hugepage/use_zero_page: 0|1
    ThpUseZeroPage,
    /// transparent_hugepage/shrink_underused: 0|1
    ThpShrinkUnderused,
    /// transparent_hugepage/anon_beside_full: 0|1 (a vendor knob of these VMs; see
    /// ../shared/reference/this-machine-live-capabilities.md §12)
    ThpAnonBesideFull,
    /// transparent_hugepage/hugepages-<size_kb>kB/enabled: always|inherit|madvise|never
    ThpSizeEnabled { size_kb: u64 },
    /// transparent_hugepage/khugepaged/<knob>: a number
    Khugepaged(KhugepagedKnob),
    /// hugepages/hugepages-<size_kb>kB/nr_hugepages: a number
    HugetlbNrHugepages { size_kb: u64 },
    /// hugepages/hugepages-<size_kb>kB/nr_overcommit_hugepages: a number
    HugetlbNrOvercommit { size_kb: u64 },
    /// vm.<name>: a number
    Sysctl(VmSysctl),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KhugepagedKnob {
    Defrag,
    MaxPtesNone,
    MaxPtesSwap,
    MaxPtesShared,
    PagesToScan,
    ScanSleepMillisecs,
    AllocSleepMillisecs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VmSysctl {
    HugetlbOptimizeVmemmap,
    NrHugepages,
    NrOvercommitHugepages,
    OvercommitMemory,
    CompactionProactiveness,
    MinFreeKbytes,
}

/// transparent_hugepage/enabled values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThpEnabled {
    Always,
    Madvise,
    Never,
}

/// hugepages-<size>/enabled values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThpSizeEnabled {
    Always,
    Inherit,
    Madvise,
    Never,
}

/// transparent_hugepage/defrag values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThpDefrag {
    Always,
    Defer,
    DeferMadvise,
    Madvise,
    Never,
}

/// The value of a `set`, already checked against what its tunable accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SetValue {
    Enabled(ThpEnabled),
    SizeEnabled(ThpSizeEnabled),
    Defrag(ThpDefrag),
    /// 0/1 flags and numeric knobs.
    Num(u64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StmtKind {
    Set {
        tunable: Tunable,
        value: SetValue,
    },
    Machine {
        params: Vec<MachineParam>,
    },
    Cgroup {
        cgroup: Name,
        memory_max: Option<Size>,
    },
    Spawn {
        proc: Name,
        cgroup: Option<Name>,
    },
    Mmap {
        proc: Name,
        region: Name,
        size: Size,
        align: Option<Size>,
        hugetlb: Option<HugetlbSize>,
        shared: bool,
        prot: Option<Prot>,
    },
    Munmap {
        proc: Name,
        range: Range,
    },
    Mprotect {
        proc: Name,
        range: Range,
        prot: Prot,
    },
    Madvise {
        proc: Name,
        range: Range,
        advice: Advice,
    },
    Read {
        proc: Name,
        range: Range,
        step: Option<Size>,
    },
    Write {
        proc: Name,
        range: Range,
        step: Option<Size>,
        zero: bool,
    },
    Pin {
        proc: Name,
        range: Range,
    },
    Unpin {
        proc: Name,
        range: Range,
    },
    Fork {
        proc: Name,
        child: Name,
    },
    ThpDisable {
        proc: Name,
        on: bool,
    },
    Exit {
        proc: Name,
    },
    Split {
        proc: Name,
        range: Range,
    },
    Khugepaged,
    Reclaim,
    /// `fragment unmovable=<percent>% [pattern=spread|clustered] [seed=<n>]`:
    /// unmovable kernel pages through physical memory (model only).
    Fragment {
        /// The share of the machine's frames, in tenths of a percent.
        permille: u32,
        pattern: FragmentPattern,
        seed: u64,
    },
    Snapshot {
        label: Name,
    },
    /// `expect <counter> [+ <counter>]... <op> <value>`: a counter, or the
    /// sum of several, against a number.
    Expect {
        /// The counters summed, in the order written; at least one.
        counters: Vec<String>,
        op: CmpOp,
        value: i64,
    },
    /// `expect errno == <ERRNO>|0`: the outcome of the statement before it.
    ExpectErrno {
        errno: Errno,
    },
    /// `expect signal == <SIGNAL>|0`: whether the process of the statement
    /// before it was killed by that signal (0: it was not killed).
    ExpectSignal {
        signal: Signal,
    },
}

impl StmtKind {
    /// The statement's keyword as written in a workload (`mmap`, `expect`, ...).
    pub fn keyword(&self) -> &'static str {
        match self {
            StmtKind::Set { .. } => "set",
            StmtKind::Machine { .. } => "machine",
            StmtKind::Cgroup { .. } => "cgroup",
            StmtKind::Spawn { .. } => "spawn",
            StmtKind::Mmap { .. } => "mmap",
            StmtKind::Munmap { .. } => "munmap",
            StmtKind::Mprotect { .. } => "mprotect",
            StmtKind::Madvise { .. } => "madvise",
            StmtKind::Read { .. } => "read",
            StmtKind::Write { .. } => "write",
            StmtKind::Pin { .. } => "pin",
            StmtKind::Unpin { .. } => "unpin",
            StmtKind::Fork { .. } => "fork",
            StmtKind::ThpDisable { .. } => "thp_disable",
            StmtKind::Exit { .. } => "exit",
            StmtKind::Split { .. } => "split",
            StmtKind::Khugepaged => "khugepaged",
            StmtKind::Reclaim => "reclaim",
            StmtKind::Fragment { .. } => "fragment",
            StmtKind::Snapshot { .. } => "snapshot",
            StmtKind::Expect { .. }
            | StmtKind::ExpectErrno { .. }
            | StmtKind::ExpectSignal { .. } => "expect",
        }
    }

    /// The process that runs the statement: the `<proc>` of `<proc> <verb>`
    /// (for `fork`, the parent), of `split` and of `spawn`. A signal that
    /// kills it during the statement is what `expect signal` checks.
    pub fn process(&self) -> Option<&str> {
        match self {
            StmtKind::Spawn { proc, .. }
            | StmtKind::Mmap { proc, .. }
            | StmtKind::Munmap { proc, .. }
            | StmtKind::Mprotect { proc, .. }
            | StmtKind::Madvise { proc, .. }
            | StmtKind::Read { proc, .. }
            | StmtKind::Write { proc, .. }
            | StmtKind::Pin { proc, .. }
            | StmtKind::Unpin { proc, .. }
            | StmtKind::Fork { proc, .. }
            | StmtKind::ThpDisable { proc, .. }
            | StmtKind::Exit { proc }
            | StmtKind::Split { proc, .. } => Some(proc),
            _ => None,
        }
    }

    /// Whether this is a `snapshot` or `expect`: a statement that checks
    /// rather than runs something.
    pub fn checks(&self) -> bool {
        matches!(
            self,
            StmtKind::Snapshot { .. }
                | StmtKind::Expect { .. }
                | StmtKind::ExpectErrno { .. }
                | StmtKind::ExpectSignal { .. }
        )
    }
}

/// Where `fragment` places its unmovable pages (see the model's `fragment`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FragmentPattern {
    /// Some in every pageblock, at seeded offsets.
    Spread,
    /// Whole pageblocks, in a seeded order.
    Clustered,
}

impl FragmentPattern {
    pub fn name(self) -> &'static str {
        match self {
            FragmentPattern::Spread => "spread",
            FragmentPattern::Clustered => "clustered",
        }
    }
}
