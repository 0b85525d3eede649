//! Readings that cost nothing when nothing changed: each process's counters
//! (smaps per region and in total, folio counts, minflt) are kept from one
//! reading to the next until a statement may have changed them.
//!
//! hugelab's own, not a kernel structure and no kernel file: the kernel
//! (Linux 6.18 `fs/proc/task_mmu.c`) computes smaps by walking the page
//! tables at every read, and so did the model, which made a
//! snapshot of hundreds of processes cost a walk of all their memory.
//!
//! What a statement may change: its own process's readings, and those of
//! every process sharing folios with it. Folios are shared only within a
//! fork family (the mms under one root anon_vma, see `rmap::AnonVmas`): a
//! copy-on-write fault in one child changes the Pss of its parent and of
//! every sibling still mapping the page. So a statement of process P marks
//! P's whole family changed (a per-family epoch), and statements that act on
//! every process (`reclaim`, `khugepaged`, `set`, `machine`) mark everything
//! changed (the global epoch); a `read` or `write` that takes no fault
//! changes nothing. A process's cached counters are used while
//! both epochs are what they were when they were computed.

use crate::mm_types::MmId;
use crate::rmap::AnonVmas;
use crate::{Machine, Task};
use hugelab_workload::{stmt, StmtKind};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The counters of one process as last computed, and when.
struct Entry {
    mm_id: MmId,
    global: u64,
    family: u64,
    /// Sorted by name.
    counters: Vec<(String, i64)>,
    /// Where each of `PROCESS_FAMILIES` starts in `counters`.
    family_starts: [usize; PROCESS_FAMILIES.len() + 1],
}

#[derive(Default)]
pub struct ReadingCache {
    global_epoch: u64,
    family_epochs: HashMap<MmId, u64>,
    /// The root anon_vma of each mm seen (a live anon_vma keeps its parents,
    /// so an mm's root never changes).
    roots: HashMap<MmId, MmId>,
    procs: HashMap<String, Entry>,
}

/// The processes whose readings a statement may change.
pub enum Touches<'a> {
    Nothing,
    /// This process and its fork family.
    Family(&'a str),
    /// This process and its fork family if the statement faults (a load
    /// or store that needs no fault changes no counter).
    FamilyIfFaulting(&'a str),
    Everything,
}

/// What `kind` may change, conservatively. Every statement is listed (no `_`
/// arm, as the statement tables have none): a new one must say what it
/// touches.
pub fn touches(kind: &StmtKind) -> Touches<'_> {
    match kind {
        StmtKind::Snapshot { .. } | StmtKind::Expect { .. } | StmtKind::ExpectErrno { .. } => {
            Touches::Nothing
        }
        // A new process has nothing cached yet.
        // A new process has nothing cached yet; a new thread changes no
        // reading.
        StmtKind::Spawn { .. } | StmtKind::Cgroup { .. } | StmtKind::Thread { .. } => {
            Touches::Nothing
        }
        StmtKind::Mmap(stmt::Mmap { proc, .. })
        | StmtKind::Munmap(stmt::Munmap { proc, .. })
        | StmtKind::Mprotect(stmt::Mprotect { proc, .. })
        | StmtKind::Mremap(stmt::Mremap { proc, .. })
        | StmtKind::Madvise(stmt::Madvise { proc, .. })
        | StmtKind::Brk(stmt::Brk { proc, .. })
        | StmtKind::Pin(stmt::Pin { proc, .. })
        | StmtKind::Unpin(stmt::Unpin { proc, .. })
        | StmtKind::Fork(stmt::Fork { proc, .. })
        | StmtKind::ThpDisable(stmt::ThpDisable { proc, .. })
        | StmtKind::Exit(stmt::Exit { proc })
        | StmtKind::Exec(stmt::Exec { proc })
        | StmtKind::Split(stmt::Split { proc, .. })
        | StmtKind::Special(stmt::Special { proc, .. }) => Touches::Family(proc),
        StmtKind::Read(stmt::Read { proc, .. }) | StmtKind::Write(stmt::Write { proc, .. }) => {
            Touches::FamilyIfFaulting(proc)
        }
        StmtKind::Set(_)
        | StmtKind::Machine(_)
        | StmtKind::Fragment(_)
        | StmtKind::Khugepaged
        // khugepaged's passes, paced by time (see khugepaged_thread).
        | StmtKind::Sleep(_)
        | StmtKind::Reclaim
        | StmtKind::ExpectSignal(_) => Touches::Everything,
    }
}

impl ReadingCache {
    /// Before a statement runs: forget what it may change.
    pub fn invalidate(
        &mut self,
        touches: Touches,
        tasks: &BTreeMap<String, Task>,
        anon_vmas: &AnonVmas,
    ) {
        match touches {
            Touches::Nothing => {}
            Touches::Everything => self.global_epoch += 1,
            Touches::Family(proc) | Touches::FamilyIfFaulting(proc) => {
                // No such process: the statement fails and changes nothing.
                if let Some(task) = tasks.get(proc) {
                    let root = self.root(anon_vmas, task.mm);
                    *self.family_epochs.entry(root).or_default() += 1;
                }
            }
        }
        // Forget exited mms and dead families now and then (amortised O(1)),
        // so that a workload of many short-lived processes keeps this small.
        if self.roots.len() > 2 * tasks.len() + 64 {
            let live: rustc_hash::FxHashSet<MmId> = tasks.values().map(|t| t.mm).collect();
            self.roots.retain(|mm, _| live.contains(mm));
            let families: rustc_hash::FxHashSet<MmId> = self.roots.values().copied().collect();
            self.family_epochs.retain(|root, _| families.contains(root));
        }
    }

    fn root(&mut self, anon_vmas: &AnonVmas, mm_id: MmId) -> MmId {
        *self
            .roots
            .entry(mm_id)
            .or_insert_with(|| anon_vmas.root(mm_id))
    }

    /// The processes whose cached counters are taken as fresh but differ
    /// from a fresh computation (a statement changed them without marking
    /// them): for the invariant checker.
    pub fn stale(
        &self,
        m: &Machine,
        tasks: &BTreeMap<String, Task>,
        compute: fn(&Machine, &str, &Task) -> Vec<(String, i64)>,
    ) -> Vec<String> {
        let mut bad = Vec::new();
        for (proc, task) in tasks {
            let Some(e) = self.procs.get(proc) else {
                continue;
            };
            let root = self.roots.get(&task.mm).copied();
            let family = root.and_then(|r| self.family_epochs.get(&r)).copied();
            let fresh = e.mm_id == task.mm
                && e.global == self.global_epoch
                && family.unwrap_or(0) == e.family;
            if fresh && compute(m, proc, task) != e.counters {
                bad.push(format!(
                    "{proc}: cached readings taken as fresh but out of date"
                ));
            }
        }
        bad
    }

    /// Drops the entries of processes that exited.
    pub fn retain_live(&mut self, tasks: &BTreeMap<String, Task>) {
        if self.procs.len() > tasks.len() {
            self.procs.retain(|name, _| tasks.contains_key(name));
        }
    }

    /// The counters of `proc` of family `family` (an index into
    /// `PROCESS_FAMILIES`) as cached, fresh or not.
    pub fn cached(&self, proc: &str, family: usize) -> Option<&[(String, i64)]> {
        let e = self.procs.get(proc)?;
        Some(&e.counters[e.family_starts[family]..e.family_starts[family + 1]])
    }

    /// The counters of `proc`: cached, or computed by `compute` and cached.
    pub fn proc_counters(
        &mut self,
        m: &Machine,
        proc: &str,
        task: &Task,
        compute: fn(&Machine, &str, &Task) -> Vec<(String, i64)>,
    ) -> &[(String, i64)] {
        let mm_id = task.mm;
        let root = self.root(&m.anon_vmas, mm_id);
        let family = self.family_epochs.get(&root).copied().unwrap_or(0);
        let global = self.global_epoch;
        let fresh = |e: &Entry| e.mm_id == mm_id && e.global == global && e.family == family;
        if !self.procs.get(proc).is_some_and(fresh) {
            let counters = compute(m, proc, task);
            let mut family_starts = [counters.len(); PROCESS_FAMILIES.len() + 1];
            for (i, prefix) in PROCESS_FAMILIES.iter().enumerate() {
                family_starts[i] = counters.partition_point(|(n, _)| n.as_str() < *prefix);
            }
            debug_assert!(counters
                .iter()
                .all(|(n, _)| PROCESS_FAMILIES.iter().any(|f| n.starts_with(f))));
            self.procs.insert(
                proc.to_string(),
                Entry {
                    mm_id,
                    global,
                    family,
                    counters,
                    family_starts,
                },
            );
        }
        &self.procs[proc].counters
    }
}

/// The name prefixes of the per-process counters, in sorted order.
pub(crate) const PROCESS_FAMILIES: [&str; 3] = ["folios.", "smaps.", "stat."];
