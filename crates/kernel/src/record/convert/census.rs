//! The first pass over a recording: what the workload's header says and
//! what the second pass must know before it writes a statement — each
//! process's name (after the program it took the most faults in: a shell
//! that execs a compiler is named after the compiler) and how far each main
//! stack grew (its region is mapped at exec, reaching that far).

use super::super::event::{Event, Kind};
use super::names::{ident, Unique};
use super::tasks::{Change, ProcId, Tracker};
use std::collections::HashMap;

/// How far below its start a fault still counts as the stack growing (8
/// times the default RLIMIT_STACK; top-down mmaps start at least 128 MiB
/// below the stack).
const STACK_REACH: u64 = 64 << 20;

#[derive(Default)]
pub struct Census {
    tracker: Tracker,
    /// Per process and exec: the main stack's start, and the lowest page
    /// faulted below it.
    stacks: HashMap<(ProcId, u32), (u64, Option<u64>)>,
    /// Per process: each program it ran (its comm), with its faults.
    programs: Vec<Vec<(String, u64)>>,
    /// Per process: its pid.
    pids: Vec<u32>,
    pub events: u64,
    pub faults: u64,
    pub threads: u64,
    pub execs: u64,
    pub first: Option<u64>,
    pub last: u64,
}

impl Census {
    pub fn add(&mut self, e: &Event) {
        self.events += 1;
        self.first.get_or_insert(e.time);
        self.last = self.last.max(e.time);
        match self.tracker.apply(e) {
            Change::Thread { .. } => self.threads += 1,
            Change::Exec(p) => {
                self.execs += 1;
                let comm = self.tracker.procs[p].comm.clone();
                self.programs[p].push((comm, 0));
            }
            Change::Spawn(p) | Change::Fork { child: p, .. } => {
                let comm = self.tracker.procs[p].comm.clone();
                self.programs.push(vec![(comm, 0)]);
                self.pids.push(match e.kind {
                    Kind::NewTask { child, .. } => child,
                    _ => e.pid,
                });
                debug_assert_eq!(self.programs.len(), p + 1);
            }
            _ => {}
        }
        let Some(task) = self.tracker.task(e.tid) else {
            return;
        };
        let generation = self.tracker.procs[task.mm].execs;
        match &e.kind {
            // The first is exec's; later ones are the stack growing.
            Kind::Mmap2 { addr, filename, .. } if filename == "[stack]" => {
                self.stacks
                    .entry((task.mm, generation))
                    .or_insert((*addr, None));
            }
            Kind::Fault { addr, .. } => {
                self.faults += 1;
                if let Some(p) = self.programs[task.mm].last_mut() {
                    p.1 += 1;
                }
                if let Some((start, low)) = self.stacks.get_mut(&(task.mm, generation)) {
                    if *addr < *start && *addr >= start.saturating_sub(STACK_REACH) {
                        let page = addr & !0xfff;
                        *low = Some(low.map_or(page, |l: u64| l.min(page)));
                    }
                }
            }
            _ => {}
        }
    }

    pub fn processes(&self) -> usize {
        self.tracker.procs.len()
    }

    /// The processes' names, by [`ProcId`].
    pub fn names(&self) -> Vec<String> {
        let mut unique = Unique::default();
        self.programs
            .iter()
            .map(|runs| {
                let most = runs.iter().rev().max_by_key(|(_, faults)| *faults);
                unique.take(&ident(most.map_or("proc", |(comm, _)| comm)))
            })
            .collect()
    }

    /// The processes' pids, by [`ProcId`].
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }

    /// The lowest page the main stack of `proc` after `execs` execs reached.
    pub fn stack_low(&self, proc: ProcId, execs: u32) -> Option<u64> {
        self.stacks.get(&(proc, execs)).and_then(|s| s.1)
    }
}
