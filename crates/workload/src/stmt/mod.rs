//! The statements of a workload: one struct per statement, each in the file
//! of its mechanism, carrying its own grammar (`parse`), its own rules
//! (`check`) and its own canonical text (`Display`).
//!
//! **How statements are kept from drifting apart.** A statement is written
//! once: its struct (the fields it has) together with its `parse`, `check`
//! and `Display`, in one file here (`mmap.rs` holds [`Mmap`], as `mm/mmap.c`
//! holds `SYSCALL_DEFINE6(mmap_pgoff)`). [`StmtKind`] has one variant per
//! statement wrapping that struct (a statement without arguments, such as
//! `khugepaged`, is a unit variant and needs no struct). Every place that
//! gives statements their own behaviour is a thin table from variant to the
//! statement's own code, one line per statement, and a `match` on
//! [`StmtKind`] there has no `_` arm, so that the compiler lists every table
//! a new statement must join: the parser's
//! keyword and verb tables ([`crate::parse`]), the checker's
//! ([`crate::check`]), the printer's ([`crate::print`]),
//! [`StmtKind::keyword`] and [`StmtKind::process`], and each backend's
//! `execute_stmt` (the kernel backend's handlers live in the module of their
//! mechanism in turn: `crates/kernel/src/mmap.rs`, `madvise.rs`, ...).
//! Adding a statement is one file here, one variant, and one line per table.
//! (The runner, [`crate::backend::run_stream`], tells only the statements
//! that check, snapshot and expect, from those that run on a backend.)
//!
//! Each file uses only what is below it: [`crate::ast`] (the values
//! statements are made of), `crate::line` (reading a line's tokens) and
//! `crate::checker` (what exists at that point of the workload).

mod access;
mod brk;
mod cgroup;
mod exec;
mod exit;
mod expect;
mod fork;
mod fragment;
mod gup;
mod machine;
mod madvise;
pub(crate) mod mmap;
mod mprotect;
mod mremap;
mod munmap;
mod set;
mod sleep;
mod snapshot;
mod spawn;
mod special;
mod split;
mod thp_disable;
mod thread;

pub use access::{Read, Write};
pub use brk::Brk;
pub use cgroup::Cgroup;
pub use exec::Exec;
pub use exit::Exit;
pub use expect::{Expect, ExpectErrno, ExpectSignal};
pub use fork::Fork;
pub use fragment::Fragment;
pub use gup::{Pin, Unpin};
pub use machine::Machine;
pub use madvise::Madvise;
pub use mmap::Mmap;
pub use mprotect::Mprotect;
pub use mremap::Mremap;
pub use munmap::Munmap;
pub use set::Set;
pub use sleep::{parse_duration, Sleep};
pub use snapshot::Snapshot;
pub use spawn::Spawn;
pub use special::{special_mapping, Special, SpecialMapping, SPECIAL_MAPPINGS};
pub use split::Split;
pub use thp_disable::ThpDisable;
pub use thread::Thread;

pub(crate) use expect::parse as parse_expect;

impl From<expect::Parsed> for StmtKind {
    fn from(e: expect::Parsed) -> StmtKind {
        match e {
            expect::Parsed::Expect(s) => StmtKind::Expect(s),
            expect::Parsed::Errno(s) => StmtKind::ExpectErrno(s),
            expect::Parsed::Signal(s) => StmtKind::ExpectSignal(s),
        }
    }
}

use crate::ast::Pos;

/// A whole workload: its statements in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// The name the workload was read from, as given by the user (used in errors).
    pub file: String,
    pub stmts: Vec<Stmt>,
}

/// One statement with its position. Equality ignores nothing: two ASTs are equal
/// only if statements sit at the same places too (the round-trip test compares
/// `kind`s, since printing canonicalises spacing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stmt {
    pub pos: Pos,
    pub kind: StmtKind,
}

/// Every statement, each wrapping its own struct (see the module doc).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StmtKind {
    Set(Set),
    Machine(Machine),
    Cgroup(Cgroup),
    Spawn(Spawn),
    Mmap(Mmap),
    Munmap(Munmap),
    Mprotect(Mprotect),
    Mremap(Mremap),
    Madvise(Madvise),
    Brk(Brk),
    Read(Read),
    Write(Write),
    Special(Special),
    Pin(Pin),
    Unpin(Unpin),
    Fork(Fork),
    ThpDisable(ThpDisable),
    Thread(Thread),
    Exit(Exit),
    Exec(Exec),
    Split(Split),
    Khugepaged,
    Reclaim,
    Fragment(Fragment),
    Sleep(Sleep),
    Snapshot(Snapshot),
    Expect(Expect),
    ExpectErrno(ExpectErrno),
    ExpectSignal(ExpectSignal),
}

impl StmtKind {
    /// The statement's keyword as written in a workload (`mmap`, `expect`, ...).
    pub fn keyword(&self) -> &'static str {
        match self {
            StmtKind::Set(_) => "set",
            StmtKind::Machine(_) => "machine",
            StmtKind::Cgroup(_) => "cgroup",
            StmtKind::Spawn(_) => "spawn",
            StmtKind::Mmap(_) => "mmap",
            StmtKind::Munmap(_) => "munmap",
            StmtKind::Mprotect(_) => "mprotect",
            StmtKind::Mremap(_) => "mremap",
            StmtKind::Madvise(_) => "madvise",
            StmtKind::Brk(_) => "brk",
            StmtKind::Read(_) => "read",
            StmtKind::Write(_) => "write",
            StmtKind::Special(_) => "special",
            StmtKind::Pin(_) => "pin",
            StmtKind::Unpin(_) => "unpin",
            StmtKind::Fork(_) => "fork",
            StmtKind::ThpDisable(_) => "thp_disable",
            StmtKind::Thread(_) => "thread",
            StmtKind::Exit(_) => "exit",
            StmtKind::Exec(_) => "exec",
            StmtKind::Split(_) => "split",
            StmtKind::Khugepaged => "khugepaged",
            StmtKind::Reclaim => "reclaim",
            StmtKind::Fragment(_) => "fragment",
            StmtKind::Sleep(_) => "sleep",
            StmtKind::Snapshot(_) => "snapshot",
            StmtKind::Expect(_) | StmtKind::ExpectErrno(_) | StmtKind::ExpectSignal(_) => "expect",
        }
    }

    /// The process that runs the statement: the `<proc>` of `<proc> <verb>`
    /// (for `fork`, the parent), of `split` and of `spawn`. A signal that
    /// kills it during the statement is what `expect signal` checks.
    pub fn process(&self) -> Option<&str> {
        match self {
            StmtKind::Spawn(s) => Some(&s.proc),
            StmtKind::Mmap(s) => Some(&s.proc),
            StmtKind::Munmap(s) => Some(&s.proc),
            StmtKind::Mprotect(s) => Some(&s.proc),
            StmtKind::Mremap(s) => Some(&s.proc),
            StmtKind::Madvise(s) => Some(&s.proc),
            StmtKind::Brk(s) => Some(&s.proc),
            StmtKind::Read(s) => Some(&s.proc),
            StmtKind::Write(s) => Some(&s.proc),
            StmtKind::Special(s) => Some(&s.proc),
            StmtKind::Pin(s) => Some(&s.proc),
            StmtKind::Unpin(s) => Some(&s.proc),
            StmtKind::Fork(s) => Some(&s.proc),
            StmtKind::ThpDisable(s) => Some(&s.proc),
            StmtKind::Thread(s) => Some(&s.proc),
            StmtKind::Exit(s) => Some(&s.proc),
            StmtKind::Exec(s) => Some(&s.proc),
            StmtKind::Split(s) => Some(&s.proc),
            StmtKind::Set(_)
            | StmtKind::Machine(_)
            | StmtKind::Cgroup(_)
            | StmtKind::Khugepaged
            | StmtKind::Reclaim
            | StmtKind::Fragment(_)
            | StmtKind::Sleep(_)
            | StmtKind::Snapshot(_)
            | StmtKind::Expect(_)
            | StmtKind::ExpectErrno(_)
            | StmtKind::ExpectSignal(_) => None,
        }
    }

    /// Whether this is a `snapshot` or `expect`: a statement that checks
    /// rather than runs something.
    pub fn checks(&self) -> bool {
        matches!(
            self,
            StmtKind::Snapshot(_)
                | StmtKind::Expect(_)
                | StmtKind::ExpectErrno(_)
                | StmtKind::ExpectSignal(_)
        )
    }
}
