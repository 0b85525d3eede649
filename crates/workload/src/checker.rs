//! What the semantic pass ([`crate::check`]) knows at a point of a workload:
//! the processes (spawned, forked, exited) and their regions (name → size and
//! what of it is still mapped), cgroups, snapshot labels, the machine's base
//! page; and the lookups every statement's `check` shares (a live process, a
//! range of one of its regions, a counter name). Each statement's own rules
//! are in its file under [`crate::stmt`].

use crate::ast::*;
use crate::mapped::Mapped;
use crate::text::{quote, valid_name, RESERVED};
use crate::units::PAGE_SIZE;
use std::collections::BTreeMap;

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
    /// `at=` of an mmap.
    At,
    /// `initial=` of an mmap.
    Initial,
    /// A flag of an mmap (`populate`, `stack`, `growsdown`).
    Flag(&'static str),
    /// `file=` of an mmap.
    File,
    /// `offset=` of an mmap.
    Offset,
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

pub(crate) fn issue(part: Part, message: impl Into<String>) -> Issue {
    Issue {
        part: Some(part),
        message: message.into(),
    }
}

pub(crate) fn stmt_issue(message: impl Into<String>) -> Issue {
    Issue {
        part: None,
        message: message.into(),
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Region {
    pub(crate) size: u64,
    pub(crate) line: u32,
    pub(crate) mapped: Mapped,
    /// A heap made by `brk`, whose later `brk`s move its break: the start
    /// of its brk area.
    pub(crate) brk: Option<u64>,
}

#[derive(Clone, Debug)]
pub(crate) struct Process {
    /// "spawned" or "forked", and the line, for "already exists" messages.
    pub(crate) origin: &'static str,
    pub(crate) line: u32,
    pub(crate) exited: Option<u32>,
    /// The signal that killed it, when it did not exit by itself (an
    /// `expect signal` said so).
    pub(crate) killed: Option<Signal>,
    /// The regions that exist now.
    pub(crate) regions: BTreeMap<Name, Region>,
    /// Regions this process name had and that are gone, with why and where
    /// ("fully unmapped at line 7"): their counters may still be named.
    pub(crate) gone: BTreeMap<Name, Gone>,
}

/// A live thread of a process (`<proc> thread <name>`): a task name that
/// statements may use as the process's, with its address space.
#[derive(Clone, Debug)]
pub(crate) struct Thread {
    /// The process (thread group leader) it belongs to.
    pub(crate) process: Name,
    pub(crate) line: u32,
}

/// Why a region's name is free again, and from which line.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Gone {
    pub(crate) line: u32,
    pub(crate) how: &'static str,
}

impl Process {
    pub(crate) fn new(origin: &'static str, line: u32, regions: BTreeMap<Name, Region>) -> Process {
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
    pub(crate) base_page: u64,
    pub(crate) machine_keys: BTreeMap<&'static str, u32>,
    /// The first statement that runs something, which `machine` must precede.
    pub(crate) started: Option<(u32, &'static str)>,
    pub(crate) cgroups: BTreeMap<Name, u32>,
    pub(crate) procs: BTreeMap<Name, Process>,
    /// The live threads by name; one that exits is forgotten.
    pub(crate) threads: BTreeMap<Name, Thread>,
    pub(crate) snapshots: BTreeMap<Name, u32>,
    /// The line of the last statement that runs something, which
    /// `expect errno` and `expect signal` check, and the process that ran it.
    pub(crate) last_call: Option<(u32, Option<Name>)>,
}

/// Up to a few names, for "it has buf, heap" style hints.
pub(crate) fn list<'a>(names: impl Iterator<Item = &'a String>) -> String {
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
            threads: BTreeMap::new(),
            snapshots: BTreeMap::new(),
            last_call: None,
        }
    }

    /// Whether `name` was spawned or forked so far (exited or not), or is
    /// a live thread.
    pub(crate) fn has_process(&self, name: &str) -> bool {
        self.procs.contains_key(name) || self.threads.contains_key(name)
    }

    /// The process whose address space task `name` uses: itself, or the
    /// process a live thread of that name belongs to.
    fn group_of<'a>(&'a self, name: &'a str) -> &'a str {
        self.threads.get(name).map_or(name, |t| t.process.as_str())
    }

    /// The live process task `name` belongs to (itself, or its thread's).
    pub(crate) fn thread_group(&self, name: &str) -> Result<Name, Issue> {
        let group = self.group_of(name).to_string();
        self.live_ref(&group)?;
        Ok(group)
    }

    /// Records thread `name` of live process `process`.
    pub(crate) fn insert_thread(&mut self, name: &str, process: &str, line: u32) {
        let t = Thread {
            process: process.to_string(),
            line,
        };
        self.threads.insert(name.to_string(), t);
    }

    /// Ends every thread of `process` (exit_group, exec's de_thread).
    pub(crate) fn end_threads(&mut self, process: &str) {
        self.threads.retain(|_, t| t.process != process);
    }

    pub(crate) fn base(&self) -> Size {
        Size(self.base_page)
    }

    /// A process that exists and has not exited.
    pub(crate) fn live(&mut self, name: &str) -> Result<&mut Process, Issue> {
        let name = &self.group_of(name).to_string();
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
    pub(crate) fn live_ref(&self, name: &str) -> Result<&Process, Issue> {
        let name = self.group_of(name);
        match self.procs.get(name) {
            Some(p) if p.exited.is_none() => Ok(p),
            _ => Err(self.not_live(name)),
        }
    }

    /// Why `name` is not a live process: unknown, or exited.
    pub(crate) fn not_live(&self, name: &str) -> Issue {
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
    pub(crate) fn new_process(&self, name: &str, part: Part) -> Result<(), Issue> {
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
        if let Some(t) = self.threads.get(name) {
            return Err(issue(
                part,
                format!(
                    "{} already names a thread of process {} (at line {})",
                    quote(name),
                    quote(&t.process),
                    t.line
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
    pub(crate) fn insert_process(&mut self, name: &str, mut p: Process) {
        if let Some(old) = self.procs.remove(name) {
            p.gone = old.gone;
        }
        for region in p.regions.keys() {
            p.gone.remove(region);
        }
        self.procs.insert(name.to_string(), p);
    }

    /// Resolves a range of a live process's region to `[start, end)` bytes.
    pub(crate) fn range(
        &self,
        proc: &str,
        range: &Range,
        aligned: bool,
    ) -> Result<(u64, u64), Issue> {
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
    pub(crate) fn counter(&self, name: &str, part: Part) -> Result<(), Issue> {
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
}
