//! The typed syntax tree of a workload (`.hlw`), as docs/language.md describes it.
//!
//! This module holds the values statements are made of (names, sizes,
//! ranges, protections, advice, tunables...); the statements themselves, and
//! [`crate::Workload`], are in [`crate::stmt`], one struct per statement.
//!
//! Every statement keeps the line and column it came from, so a backend that
//! refuses or fails a statement can point at it (`buf.hlw:7:12: ...`).

pub use crate::errno::Errno;
pub use crate::signal::Signal;
use std::fmt;

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

/// Page protection for `mmap prot=` and `mprotect`: the PROT_READ,
/// PROT_WRITE and PROT_EXEC combinations the language has (`rw`, `r`,
/// `none`, `rx`, `rwx`, `x`; PROT_WRITE without PROT_READ is not one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prot {
    ReadWrite,
    Read,
    None,
    ReadExec,
    ReadWriteExec,
    /// PROT_EXEC alone: VM_EXEC without VM_READ.
    Exec,
}

impl Prot {
    /// Every protection, in the order the language names them.
    pub const ALL: [Prot; 6] = [
        Prot::ReadWrite,
        Prot::Read,
        Prot::None,
        Prot::ReadExec,
        Prot::ReadWriteExec,
        Prot::Exec,
    ];

    /// The language's name of the protection (`prot=NAME`).
    pub fn name(self) -> &'static str {
        match self {
            Prot::ReadWrite => "rw",
            Prot::Read => "r",
            Prot::None => "none",
            Prot::ReadExec => "rx",
            Prot::ReadWriteExec => "rwx",
            Prot::Exec => "x",
        }
    }

    /// PROT_READ.
    pub fn read(self) -> bool {
        matches!(
            self,
            Prot::ReadWrite | Prot::Read | Prot::ReadExec | Prot::ReadWriteExec
        )
    }

    /// PROT_WRITE.
    pub fn write(self) -> bool {
        matches!(self, Prot::ReadWrite | Prot::ReadWriteExec)
    }

    /// PROT_EXEC.
    pub fn exec(self) -> bool {
        matches!(self, Prot::ReadExec | Prot::ReadWriteExec | Prot::Exec)
    }

    /// The protection of PROT_* bits (PROT_READ 1, PROT_WRITE 2, PROT_EXEC
    /// 4); PROT_WRITE without PROT_READ, which the language has not, is
    /// taken as with it (x86 cannot map a page writable and not readable).
    pub fn from_bits(bits: u64) -> Prot {
        let (write, exec) = (bits & 2 != 0, bits & 4 != 0);
        match (bits & 1 != 0 || write, write, exec) {
            (true, true, false) => Prot::ReadWrite,
            (true, true, true) => Prot::ReadWriteExec,
            (true, false, false) => Prot::Read,
            (true, false, true) => Prot::ReadExec,
            (false, _, true) => Prot::Exec,
            (false, _, false) => Prot::None,
        }
    }
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
    /// MADV_POPULATE_READ: page tables populated readable (GUP read faults).
    PopulateRead,
    /// MADV_POPULATE_WRITE: populated writable (GUP write faults).
    PopulateWrite,
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
    /// `pkeys=on|off`: x86 memory protection keys in use (CPU flag `ospke`):
    /// an execute-only mapping gets an access-disabled key, and a read of it
    /// is SIGSEGV.
    Pkeys(bool),
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
impl Advice {
    /// Every advice, in the order error messages list them.
    pub const ALL: [Advice; 9] = [
        Advice::Hugepage,
        Advice::NoHugepage,
        Advice::DontNeed,
        Advice::Free,
        Advice::Collapse,
        Advice::Pageout,
        Advice::Cold,
        Advice::PopulateRead,
        Advice::PopulateWrite,
    ];

    /// The kernel's MADV_ name without the prefix, as written in a workload.
    pub fn name(self) -> &'static str {
        match self {
            Advice::Hugepage => "HUGEPAGE",
            Advice::NoHugepage => "NOHUGEPAGE",
            Advice::DontNeed => "DONTNEED",
            Advice::Free => "FREE",
            Advice::Collapse => "COLLAPSE",
            Advice::Pageout => "PAGEOUT",
            Advice::Cold => "COLD",
            Advice::PopulateRead => "POPULATE_READ",
            Advice::PopulateWrite => "POPULATE_WRITE",
        }
    }
}

impl HugetlbSize {
    /// The huge page size in bytes.
    pub fn bytes(self) -> Size {
        match self {
            HugetlbSize::Size2M => Size(2 << 20),
            HugetlbSize::Size1G => Size(1 << 30),
        }
    }
}
