//! The canonical text of a workload: what `Display` prints for every AST type.
//!
//! Printing is the parser's inverse up to spacing, comments and spelling of
//! sizes: `parse(print(w))` has the same statement kinds as `w` for every `w`
//! that passes [`crate::check::check`]. Options are printed in one fixed order
//! and sizes with the largest binary suffix that divides them exactly.

use crate::ast::*;
use crate::stmt::{Stmt, StmtKind, Workload};
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
        f.write_str(self.name())
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
            MachineParam::Pkeys(on) => write!(f, "pkeys={}", if *on { "on" } else { "off" }),
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
    /// The statement as a workload line, without its position or newline:
    /// a thin table to each statement's own `Display` (in [`crate::stmt`]).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StmtKind::Set(s) => s.fmt(f),
            StmtKind::Machine(s) => s.fmt(f),
            StmtKind::Cgroup(s) => s.fmt(f),
            StmtKind::Spawn(s) => s.fmt(f),
            StmtKind::Mmap(s) => s.fmt(f),
            StmtKind::Munmap(s) => s.fmt(f),
            StmtKind::Mprotect(s) => s.fmt(f),
            StmtKind::Mremap(s) => s.fmt(f),
            StmtKind::Madvise(s) => s.fmt(f),
            StmtKind::Brk(s) => s.fmt(f),
            StmtKind::Read(s) => s.fmt(f),
            StmtKind::Write(s) => s.fmt(f),
            StmtKind::Special(s) => s.fmt(f),
            StmtKind::Pin(s) => s.fmt(f),
            StmtKind::Unpin(s) => s.fmt(f),
            StmtKind::Fork(s) => s.fmt(f),
            StmtKind::ThpDisable(s) => s.fmt(f),
            StmtKind::Thread(s) => s.fmt(f),
            StmtKind::Exit(s) => s.fmt(f),
            StmtKind::Exec(s) => s.fmt(f),
            StmtKind::Split(s) => s.fmt(f),
            StmtKind::Khugepaged => f.write_str("khugepaged"),
            StmtKind::Sleep(s) => s.fmt(f),
            StmtKind::Reclaim => f.write_str("reclaim"),
            StmtKind::Fragment(s) => s.fmt(f),
            StmtKind::Snapshot(s) => s.fmt(f),
            StmtKind::Expect(s) => s.fmt(f),
            StmtKind::ExpectErrno(s) => s.fmt(f),
            StmtKind::ExpectSignal(s) => s.fmt(f),
        }
    }
}
