//! The canonical text of a workload: what `Display` prints for every AST type.
//!
//! Printing is the parser's inverse up to spacing, comments and spelling of
//! sizes: `parse(print(w))` has the same statement kinds as `w` for every `w`
//! that passes [`crate::check::check`]. Options are printed in one fixed order
//! and sizes with the largest binary suffix that divides them exactly.

use crate::ast::*;
use std::fmt;

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for stmt in &self.stmts {
            writeln!(f, "{}", stmt.kind)?;
        }
        Ok(())
    }
}

impl fmt::Display for Stmt {
    /// The statement alone, without its position (as [`StmtKind`] prints it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.kind.fmt(f)
    }
}

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u64, &str); 4] = [
            (1 << 40, "T"),
            (1 << 30, "G"),
            (1 << 20, "M"),
            (1 << 10, "K"),
        ];
        let n = self.0;
        if n != 0 {
            for (unit, suffix) in UNITS {
                if n.is_multiple_of(unit) {
                    return write!(f, "{}{suffix}", n / unit);
                }
            }
        }
        write!(f, "{n}")
    }
}

impl fmt::Display for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.region)?;
        if let Some(off) = self.offset {
            write!(f, "+{off}")?;
        }
        if let Some(len) = self.len {
            write!(f, ":{len}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Prot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Prot::ReadWrite => "rw",
            Prot::Read => "r",
            Prot::None => "none",
        })
    }
}

impl fmt::Display for Advice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for HugetlbSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HugetlbSize::Size2M => "2M",
            HugetlbSize::Size1G => "1G",
        })
    }
}

impl fmt::Display for CmpOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Arch::X86_64 => "x86_64",
            Arch::Arm64 => "arm64",
        })
    }
}

impl fmt::Display for MachineParam {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MachineParam::Arch(a) => write!(f, "arch={a}"),
            MachineParam::BasePage(s) => write!(f, "base_page={s}"),
            MachineParam::Memory(s) => write!(f, "memory={s}"),
            MachineParam::Hvo(HvoRuleName::Linux618) => write!(f, "hvo=6.18"),
            MachineParam::Hvo(HvoRuleName::Series2021) => write!(f, "hvo=2021"),
            MachineParam::StructPage(n) => write!(f, "struct_page={n}"),
        }
    }
}

impl fmt::Display for Tunable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path())
    }
}

impl fmt::Display for ThpEnabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for ThpSizeEnabled {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for ThpDefrag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl fmt::Display for SetValue {
    /// The text the tunable's file takes (`always`, `defer+madvise`, `409`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SetValue::Enabled(v) => v.fmt(f),
            SetValue::SizeEnabled(v) => v.fmt(f),
            SetValue::Defrag(v) => v.fmt(f),
            SetValue::Num(n) => write!(f, "{n}"),
        }
    }
}

impl fmt::Display for StmtKind {
    /// The statement as a workload line, without its position or newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StmtKind::Set { tunable, value } => write!(f, "set {tunable} {value}"),
            StmtKind::Machine { params } => {
                f.write_str("machine")?;
                for p in params {
                    write!(f, " {p}")?;
                }
                Ok(())
            }
            StmtKind::Cgroup { cgroup, memory_max } => {
                write!(f, "cgroup {cgroup}")?;
                if let Some(m) = memory_max {
                    write!(f, " memory.max={m}")?;
                }
                Ok(())
            }
            StmtKind::Spawn { proc, cgroup } => {
                write!(f, "spawn {proc}")?;
                if let Some(cg) = cgroup {
                    write!(f, " cgroup={cg}")?;
                }
                Ok(())
            }
            StmtKind::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                shared,
                prot,
            } => {
                write!(f, "{proc} mmap {region} {size}")?;
                if let Some(a) = align {
                    write!(f, " align={a}")?;
                }
                if let Some(h) = hugetlb {
                    write!(f, " hugetlb={h}")?;
                }
                if *shared {
                    f.write_str(" shared")?;
                }
                if let Some(p) = prot {
                    write!(f, " prot={p}")?;
                }
                Ok(())
            }
            StmtKind::Munmap { proc, range } => write!(f, "{proc} munmap {range}"),
            StmtKind::Mprotect { proc, range, prot } => write!(f, "{proc} mprotect {range} {prot}"),
            StmtKind::Madvise {
                proc,
                range,
                advice,
            } => write!(f, "{proc} madvise {range} {advice}"),
            StmtKind::Read { proc, range, step } => {
                write!(f, "{proc} read {range}")?;
                if let Some(s) = step {
                    write!(f, " step={s}")?;
                }
                Ok(())
            }
            StmtKind::Write {
                proc,
                range,
                step,
                zero,
            } => {
                write!(f, "{proc} write {range}")?;
                if let Some(s) = step {
                    write!(f, " step={s}")?;
                }
                if *zero {
                    f.write_str(" zero")?;
                }
                Ok(())
            }
            StmtKind::Pin { proc, range } => write!(f, "{proc} pin {range}"),
            StmtKind::Unpin { proc, range } => write!(f, "{proc} unpin {range}"),
            StmtKind::Fork { proc, child } => write!(f, "{proc} fork {child}"),
            StmtKind::ThpDisable { proc, on } => {
                write!(f, "{proc} thp_disable {}", if *on { "on" } else { "off" })
            }
            StmtKind::Exit { proc } => write!(f, "{proc} exit"),
            StmtKind::Split { proc, range } => write!(f, "split {proc} {range}"),
            StmtKind::Khugepaged => f.write_str("khugepaged"),
            StmtKind::Reclaim => f.write_str("reclaim"),
            StmtKind::Fragment {
                permille,
                pattern,
                seed,
            } => {
                write!(f, "fragment unmovable={}", permille / 10)?;
                if permille % 10 != 0 {
                    write!(f, ".{}", permille % 10)?;
                }
                write!(f, "% pattern={}", pattern.name())?;
                if *seed != 0 {
                    write!(f, " seed={seed}")?;
                }
                Ok(())
            }
            StmtKind::Snapshot { label } => write!(f, "snapshot {label}"),
            StmtKind::Expect {
                counters,
                op,
                value,
            } => write!(f, "expect {} {op} {value}", counters.join(" + ")),
            StmtKind::ExpectErrno { errno } => write!(f, "expect errno == {errno}"),
            StmtKind::ExpectSignal { signal } => write!(f, "expect signal == {signal}"),
        }
    }
}
