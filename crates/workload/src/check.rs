//! The semantic pass: does a syntactically valid workload make sense?
//!
//! It walks the statements in order, tracking processes (spawned, forked,
//! exited), their regions (name → size and what of it is still mapped; a fork
//! child inherits its parent's), cgroups, snapshot labels and the machine's
//! base page, so that a backend can take every name, range and size it is
//! given at face value.
//!
//! Names are those of things that exist now: a region fully unmapped (by one
//! `munmap` or several) and a process that exited are gone, and their names
//! can be used again. What they were is remembered only so that an `expect`
//! may still name their counters (the backends keep the last values) and so
//! that messages can say where a name went.
//!
//! It also re-checks what the parser guarantees (names, tunable values, nonzero
//! lengths...), so that an AST built in code — a generator, a test — is held
//! to the same rules: a workload that passes [`check`] prints to text that
//! parses back to the same statements.

use crate::ast::*;
use crate::mapped::Mapped;
use crate::parse::{quote, ParseError};
use crate::units::PAGE_SIZE;
use std::collections::BTreeMap;

/// The top-level keywords: a line starting with one is that statement, so
/// none of them can name a process.
pub(crate) const RESERVED: [&str; 10] = [
    "set",
    "machine",
    "cgroup",
    "spawn",
    "split",
    "khugepaged",
    "reclaim",
    "fragment",
    "snapshot",
    "expect",
];

/// `[A-Za-z_][A-Za-z0-9_-]*`
pub(crate) fn valid_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A dotted counter name of `[A-Za-z0-9_.-]`, with no empty dotted part.
pub(crate) fn valid_counter(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
        && s.split('.').all(|part| !part.is_empty())
}

/// Which part of a statement an error is about, so that the parser, which
/// knows the tokens' columns, can point at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Part {
    Proc,
    Region,
    Size,
    Range,
    Child,
    Cgroup,
    Align,
    Step,
    Label,
    /// The i-th counter of an `expect` (0 unless it sums several).
    Counter(usize),
    MachineKey(&'static str),
}

/// A semantic error, before it is given a file, line and column.
#[derive(Debug)]
pub(crate) struct Issue {
    pub part: Option<Part>,
    pub message: String,
}

fn issue(part: Part, message: impl Into<String>) -> Issue {
    Issue {
        part: Some(part),
        message: message.into(),
    }
}

fn stmt_issue(message: impl Into<String>) -> Issue {
    Issue {
        part: None,
        message: message.into(),
    }
}

#[derive(Clone, Debug)]
struct Region {
    size: u64,
    line: u32,
    mapped: Mapped,
}

#[derive(Clone, Debug)]
struct Process {
    /// "spawned" or "forked", and the line, for "already exists" messages.
    origin: &'static str,
    line: u32,
    exited: Option<u32>,
    /// The signal that killed it, when it did not exit by itself (an
    /// `expect signal` said so).
    killed: Option<Signal>,
    /// The regions that exist now.
    regions: BTreeMap<Name, Region>,
    /// Regions this process name had and that are gone, with why and where
    /// ("fully unmapped at line 7"): their counters may still be named.
    gone: BTreeMap<Name, Gone>,
}

/// Why a region's name is free again, and from which line.
#[derive(Clone, Copy, Debug)]
struct Gone {
    line: u32,
    how: &'static str,
}

impl Process {
    fn new(origin: &'static str, line: u32, regions: BTreeMap<Name, Region>) -> Process {
        Process {
            origin,
            line,
            exited: None,
            killed: None,
            regions,
            gone: BTreeMap::new(),
        }
    }
}

/// The state of the semantic pass, one statement at a time (the parser feeds
/// it as it goes, so that the first error in file order wins).
#[derive(Debug)]
pub(crate) struct Checker {
    base_page: u64,
    machine_keys: BTreeMap<&'static str, u32>,
    /// The first statement that runs something, which `machine` must precede.
    started: Option<(u32, &'static str)>,
    cgroups: BTreeMap<Name, u32>,
    procs: BTreeMap<Name, Process>,
    snapshots: BTreeMap<Name, u32>,
    /// The line of the last statement that runs something, which
    /// `expect errno` and `expect signal` check, and the process that ran it.
    last_call: Option<(u32, Option<Name>)>,
}

/// Up to a few names, for "it has buf, heap" style hints.
fn list<'a>(names: impl Iterator<Item = &'a String>) -> String {
    const MAX: usize = 10;
    let mut v: Vec<&str> = names.map(String::as_str).take(MAX + 1).collect();
    let more = v.len() > MAX;
    v.truncate(MAX);
    let mut s = v.join(", ");
    if more {
        s.push_str(", ...");
    }
    s
}

impl Checker {
    pub(crate) fn new() -> Checker {
        Checker {
            base_page: PAGE_SIZE,
            machine_keys: BTreeMap::new(),
            started: None,
            cgroups: BTreeMap::new(),
            procs: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            last_call: None,
        }
    }

    /// Whether `name` was spawned or forked so far (exited or not).
    pub(crate) fn has_process(&self, name: &str) -> bool {
        self.procs.contains_key(name)
    }

    fn base(&self) -> Size {
        Size(self.base_page)
    }

    /// A process that exists and has not exited.
    fn live(&mut self, name: &str) -> Result<&mut Process, Issue> {
        match self.procs.get(name) {
            Some(p) if p.exited.is_none() => {}
            _ => return Err(self.not_live(name)),
        }
        match self.procs.get_mut(name) {
            Some(p) => Ok(p),
            None => Err(issue(
                Part::Proc,
                format!("unknown process {}", quote(name)),
            )),
        }
    }

    /// A process that exists and has not exited, to look at.
    fn live_ref(&self, name: &str) -> Result<&Process, Issue> {
        match self.procs.get(name) {
            Some(p) if p.exited.is_none() => Ok(p),
            _ => Err(self.not_live(name)),
        }
    }

    /// Why `name` is not a live process: unknown, or exited.
    fn not_live(&self, name: &str) -> Issue {
        match self.procs.get(name) {
            Some(Process {
                exited: Some(line),
                killed: Some(signal),
                ..
            }) => issue(
                Part::Proc,
                format!(
                    "process {} was killed by {signal} (at line {line})",
                    quote(name)
                ),
            ),
            Some(Process {
                exited: Some(line), ..
            }) => issue(
                Part::Proc,
                format!("process {} has exited (at line {line})", quote(name)),
            ),
            _ => {
                let hint = if self.procs.is_empty() {
                    "no process has been spawned".to_string()
                } else {
                    format!("processes so far: {}", list(self.procs.keys()))
                };
                issue(
                    Part::Proc,
                    format!("unknown process {}; {hint}", quote(name)),
                )
            }
        }
    }

    /// A name for a new process (spawn, fork child): valid, not a keyword, unused.
    fn new_process(&self, name: &str, part: Part) -> Result<(), Issue> {
        if !valid_name(name) {
            return Err(issue(part, format!("bad process name {}", quote(name))));
        }
        if RESERVED.contains(&name) {
            return Err(issue(
                part,
                format!(
                    "{} is a statement keyword and cannot name a process",
                    quote(name)
                ),
            ));
        }
        if let Some(p) = self.procs.get(name).filter(|p| p.exited.is_none()) {
            return Err(issue(
                part,
                format!(
                    "process {} already exists ({} at line {})",
                    quote(name),
                    p.origin,
                    p.line
                ),
            ));
        }
        Ok(())
    }

    /// Records a new process under `name`, which [`Checker::new_process`]
    /// accepted: a name that an exited process had keeps that process's
    /// regions as gone ones, whose counters an `expect` may still name.
    fn insert_process(&mut self, name: &str, mut p: Process) {
        if let Some(old) = self.procs.remove(name) {
            p.gone = old.gone;
        }
        for region in p.regions.keys() {
            p.gone.remove(region);
        }
        self.procs.insert(name.to_string(), p);
    }

    /// Resolves a range of a live process's region to `[start, end)` bytes.
    fn range(&self, proc: &str, range: &Range, aligned: bool) -> Result<(u64, u64), Issue> {
        let base = self.base_page;
        let p = self.live_ref(proc)?;
        let Some(region) = p.regions.get(&range.region) else {
            let has = if p.regions.is_empty() {
                "it has no regions".to_string()
            } else {
                format!("it has {}", list(p.regions.keys()))
            };
            let gone = match p.gone.get(&range.region) {
                Some(g) => format!(" (it was {} at line {})", g.how, g.line),
                None => String::new(),
            };
            return Err(issue(
                Part::Range,
                format!(
                    "unknown region {} of process {}{gone}; {has}",
                    quote(&range.region),
                    quote(proc)
                ),
            ));
        };
        let size = region.size;
        let off = range.offset.map_or(0, Size::bytes);
        let out = |what: String| {
            issue(
                Part::Range,
                format!(
                    "range '{range}' is out of region {} of process {}: {what}",
                    quote(&range.region),
                    quote(proc)
                ),
            )
        };
        let end = match range.len {
            Some(Size(0)) => {
                return Err(issue(Part::Range, format!("zero-length range '{range}'")))
            }
            Some(len) => match off.checked_add(len.0) {
                Some(end) if end <= size => end,
                Some(end) => {
                    return Err(out(format!(
                        "offset+length {} > size {}",
                        Size(end),
                        Size(size)
                    )))
                }
                None => return Err(out("offset+length overflows".to_string())),
            },
            None if off < size => size,
            None => return Err(out(format!("offset {} >= size {}", Size(off), Size(size)))),
        };
        if aligned {
            for (what, at) in [("starts", off), ("ends", end)] {
                if at % base != 0 {
                    return Err(issue(
                        Part::Range,
                        format!(
                            "range '{range}' must start and end on base-page boundaries ({}): it {what} at {at}",
                            Size(base)
                        ),
                    ));
                }
            }
        }
        Ok((off, end))
    }

    /// A counter name the registry describes, whose process, region and
    /// cgroup parts name ones the workload has.
    fn counter(&self, name: &str, part: Part) -> Result<(), Issue> {
        let Some(c) = crate::counters::lookup(name) else {
            return Err(issue(part, crate::counters::unknown_counter_message(name)));
        };
        let missing = |what: String| Err(issue(part, format!("counter '{name}' names {what}")));
        if let Some(proc) = c.proc {
            let Some(p) = self.procs.get(proc) else {
                return missing(format!(
                    "process {}, which no statement before it spawns or forks",
                    quote(proc)
                ));
            };
            let had = |r: &str| p.regions.contains_key(r) || p.gone.contains_key(r);
            if let Some(region) = c.region.filter(|r| !had(r)) {
                return missing(format!(
                    "region {} of {}, which has no such region here",
                    quote(region),
                    quote(proc)
                ));
            }
        }
        if let Some(cg) = c.cgroup.filter(|cg| !self.cgroups.contains_key(*cg)) {
            return missing(format!(
                "cgroup {}, which no statement before it creates",
                quote(cg)
            ));
        }
        Ok(())
    }

    /// Checks one statement against everything before it, then records its effect.
    pub(crate) fn stmt(&mut self, stmt: &Stmt) -> Result<(), Issue> {
        let line = stmt.pos.line;
        match &stmt.kind {
            StmtKind::Set { .. } | StmtKind::Machine { .. } | StmtKind::Cgroup { .. } => {}
            other => {
                if self.started.is_none() {
                    self.started = Some((line, other.keyword()));
                }
            }
        }
        if !stmt.kind.checks() {
            self.last_call = Some((line, stmt.kind.process().map(str::to_string)));
        }
        match &stmt.kind {
            StmtKind::Set { tunable, value } => {
                let size_ok = match tunable {
                    Tunable::ThpSizeEnabled { size_kb }
                    | Tunable::HugetlbNrHugepages { size_kb }
                    | Tunable::HugetlbNrOvercommit { size_kb } => {
                        *size_kb >= 8 && size_kb.is_power_of_two()
                    }
                    _ => true,
                };
                if !size_ok {
                    return Err(stmt_issue(format!(
                        "bad page size in tunable {tunable}; expected a power of two of at least 8 (kB)"
                    )));
                }
                tunable.check_value(value).map_err(stmt_issue)?;
            }
            StmtKind::Machine { params } => {
                if let Some((at, what)) = self.started {
                    return Err(stmt_issue(format!(
                        "machine must come before '{what}' at line {at}"
                    )));
                }
                if params.is_empty() {
                    return Err(stmt_issue(
                        "machine needs at least one of arch=, base_page=, memory=",
                    ));
                }
                for param in params {
                    let key = match param {
                        MachineParam::Arch(_) => "arch",
                        MachineParam::BasePage(_) => "base_page",
                        MachineParam::Memory(_) => "memory",
                        MachineParam::Hvo(_) => "hvo",
                        MachineParam::StructPage(_) => "struct_page",
                    };
                    if let Some(first) = self.machine_keys.get(key) {
                        return Err(issue(
                            Part::MachineKey(key),
                            format!("machine key '{key}' already given at line {first}"),
                        ));
                    }
                    match param {
                        MachineParam::BasePage(s) if !matches!(s.0, 0x1000 | 0x4000 | 0x10000) => {
                            return Err(issue(
                                Part::MachineKey(key),
                                format!("bad base_page {s}; expected one of 4K, 16K, 64K"),
                            ));
                        }
                        MachineParam::BasePage(s) => self.base_page = s.0,
                        MachineParam::Memory(Size(0)) => {
                            return Err(issue(
                                Part::MachineKey(key),
                                "machine memory must be nonzero",
                            ));
                        }
                        _ => {}
                    }
                    self.machine_keys.insert(key, line);
                }
            }
            StmtKind::Cgroup { cgroup, .. } => {
                if !valid_name(cgroup) {
                    return Err(issue(
                        Part::Cgroup,
                        format!("bad cgroup name {}", quote(cgroup)),
                    ));
                }
                if let Some(first) = self.cgroups.get(cgroup) {
                    return Err(issue(
                        Part::Cgroup,
                        format!("cgroup {} already exists (at line {first})", quote(cgroup)),
                    ));
                }
                self.cgroups.insert(cgroup.clone(), line);
            }
            StmtKind::Spawn { proc, cgroup } => {
                self.new_process(proc, Part::Proc)?;
                if let Some(cg) = cgroup {
                    if !self.cgroups.contains_key(cg) {
                        let hint = if self.cgroups.is_empty() {
                            "no cgroup has been declared".to_string()
                        } else {
                            format!("cgroups so far: {}", list(self.cgroups.keys()))
                        };
                        return Err(issue(
                            Part::Cgroup,
                            format!("unknown cgroup {}; {hint}", quote(cg)),
                        ));
                    }
                }
                self.insert_process(proc, Process::new("spawned", line, BTreeMap::new()));
            }
            StmtKind::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                ..
            } => {
                let base = self.base();
                let p = self.live(proc)?;
                if !valid_name(region) {
                    return Err(issue(
                        Part::Region,
                        format!("bad region name {}", quote(region)),
                    ));
                }
                if let Some(r) = p.regions.get(region) {
                    return Err(issue(
                        Part::Region,
                        format!(
                            "region {} of process {} already exists (mapped at line {})",
                            quote(region),
                            quote(proc),
                            r.line
                        ),
                    ));
                }
                if size.0 == 0 {
                    return Err(issue(Part::Size, "mmap size must be nonzero"));
                }
                if size.0 % base.0 != 0 {
                    return Err(issue(
                        Part::Size,
                        format!("mmap size {size} is not a multiple of the base page ({base})"),
                    ));
                }
                if let Some(h) = hugetlb {
                    let hsize = h.bytes();
                    if size.0 % hsize.0 != 0 {
                        return Err(issue(
                            Part::Size,
                            format!("mmap size {size} is not a multiple of its hugetlb page size ({hsize})"),
                        ));
                    }
                }
                if let Some(a) = align {
                    if !a.0.is_power_of_two() || a.0 < base.0 {
                        return Err(issue(
                            Part::Align,
                            format!("align={a} must be a power of two of at least the base page ({base})"),
                        ));
                    }
                }
                p.gone.remove(region);
                p.regions.insert(
                    region.clone(),
                    Region {
                        size: size.0,
                        line,
                        mapped: Mapped::whole(size.0),
                    },
                );
            }
            StmtKind::Munmap { proc, range } => {
                let (start, end) = self.range(proc, range, true)?;
                let p = self.live(proc)?;
                let r = p.regions.get_mut(&range.region).expect("range() found it");
                r.mapped.unmap(start, end);
                if r.mapped.is_empty() {
                    p.regions.remove(&range.region);
                    p.gone.insert(
                        range.region.clone(),
                        Gone {
                            line,
                            how: "fully unmapped",
                        },
                    );
                }
            }
            StmtKind::Mprotect { proc, range, .. }
            | StmtKind::Madvise { proc, range, .. }
            | StmtKind::Pin { proc, range }
            | StmtKind::Unpin { proc, range }
            | StmtKind::Split { proc, range } => {
                self.range(proc, range, true)?;
            }
            StmtKind::Read { proc, range, step }
            | StmtKind::Write {
                proc, range, step, ..
            } => {
                self.range(proc, range, false)?;
                if *step == Some(Size(0)) {
                    return Err(issue(Part::Step, "step must be nonzero"));
                }
            }
            StmtKind::Fork { proc, child } => {
                let regions = self.live(proc)?.regions.clone();
                self.new_process(child, Part::Child)?;
                self.insert_process(child, Process::new("forked", line, regions));
            }
            StmtKind::ThpDisable { proc, .. } => {
                self.live(proc)?;
            }
            StmtKind::Exit { proc } => {
                let p = self.live(proc)?;
                p.exited = Some(line);
                let how = "gone with its process, which exited";
                for (name, _) in std::mem::take(&mut p.regions) {
                    p.gone.insert(name, Gone { line, how });
                }
            }
            StmtKind::Khugepaged | StmtKind::Reclaim | StmtKind::Fragment { .. } => {}
            StmtKind::Snapshot { label } => {
                if !valid_name(label) {
                    return Err(issue(
                        Part::Label,
                        format!("bad snapshot label {}", quote(label)),
                    ));
                }
                if label == "end" {
                    return Err(issue(
                        Part::Label,
                        "snapshot label 'end' is reserved for the end of the workload",
                    ));
                }
                if let Some(first) = self.snapshots.get(label) {
                    return Err(issue(
                        Part::Label,
                        format!("snapshot {} already taken (at line {first})", quote(label)),
                    ));
                }
                self.snapshots.insert(label.clone(), line);
            }
            StmtKind::Expect { counters, .. } => {
                if counters.is_empty() {
                    return Err(stmt_issue("expect needs a counter"));
                }
                for (i, counter) in counters.iter().enumerate() {
                    if !valid_counter(counter) {
                        return Err(issue(
                            Part::Counter(i),
                            format!("bad counter name {}", quote(counter)),
                        ));
                    }
                    self.counter(counter, Part::Counter(i))?;
                }
            }
            StmtKind::ExpectErrno { .. } => {
                if self.last_call.is_none() {
                    return Err(stmt_issue(
                        "expect errno checks the statement before it, and there is none",
                    ));
                }
            }
            StmtKind::ExpectSignal { signal } => self.expect_signal(*signal)?,
        }
        Ok(())
    }
}

impl Checker {
    /// `expect signal == S`: the statement before it must have a process;
    /// a signal other than 0 says that process was killed there, so it is
    /// gone from then on, as after `exit` (its name is free again).
    fn expect_signal(&mut self, signal: Signal) -> Result<(), Issue> {
        let Some((line, proc)) = self.last_call.clone() else {
            return Err(stmt_issue(
                "expect signal checks the process of the statement before it, and there is none",
            ));
        };
        let Some(proc) = proc else {
            return Err(stmt_issue(format!(
                "expect signal checks the process of the statement before it, and the one at line {line} runs in no process"
            )));
        };
        if signal == Signal::NONE {
            return Ok(());
        }
        // A `<proc> exit` before it: the process is already gone.
        let p = self.live(&proc)?;
        p.exited = Some(line);
        p.killed = Some(signal);
        let how = "gone with its process, which was killed";
        for (name, _) in std::mem::take(&mut p.regions) {
            p.gone.insert(name, Gone { line, how });
        }
        Ok(())
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

/// Checks a whole workload (see the module doc). Errors point at the
/// offending statement's start: an AST keeps no token columns; [`crate::parse`]
/// runs the same pass and points at the token itself.
pub fn check(w: &Workload) -> Result<(), ParseError> {
    let mut checker = Checker::new();
    for stmt in &w.stmts {
        checker.stmt(stmt).map_err(|i| ParseError {
            file: w.file.clone(),
            line: stmt.pos.line,
            col: stmt.pos.col,
            message: i.message,
        })?;
    }
    Ok(())
}
