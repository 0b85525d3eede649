//! The machine's address spaces, by id, and the tasks that use them.
//!
//! Follows Linux 6.18 `kernel/fork.c`: `mm_alloc` (a new `mm_struct` with
//! its `mm_id` from the IDA, `mm_alloc_id`), `copy_mm` with `CLONE_VM` (a
//! thread shares its parent's mm, `mmget`), and `mmput` (the last user of an
//! mm tears it down: `exit_mmap`). exec's replacement of an mm is in
//! [`crate::fs_exec`]. The kernel reaches an mm from a folio
//! (anon_vma -> vma -> vm_mm) and from `init_task`'s task list; the model
//! keeps every mm in [`Mms`], by id, so that reclaim, the OOM killer,
//! HugeTLB's `unmap_ref_private`, compaction and rmap walks find any of them
//! from the `Machine`.
//!
//! The borrow rule: an operation on one mm takes it out of the table
//! ([`Mms::take`]) and works on it as `&mut MmStruct` beside `&mut Machine`;
//! it puts it back when done ([`Mms::put`]). A walk that must reach other
//! mms meanwhile (an rmap walk, compaction's migration, memcg reclaim and
//! the OOM killer, unmap_ref_private) calls [`Machine::with_mms`], which
//! lends it the whole table plus the mm at hand as one [`MmList`]. Between
//! statements every mm is in the table.
//!
//! Simplifications: mm ids are never reused (the kernel's IDA reuses freed
//! ones); an mm whose last task exits is torn down and freed at once (no
//! lazy-TLB references keep it); the task list is ordered by name, not by
//! creation (the workload's processes have names, not pids); a thread's
//! faults are counted at its group leader at once, not in its own
//! `min_flt` folded into `signal->min_flt` when it exits (the per-process
//! sum, all the model reports, is the same); only a group leader execs
//! (de_thread's leader switch is not modelled).

use crate::mm_types::{MmId, MmStruct, MM_ID_DUMMY};
use crate::syscall::failed;
use crate::Machine;
use hugelab_workload::{BackendError, Stmt};
use std::collections::BTreeMap;

/// A task of the workload (a process, or a thread of one): the id of the
/// mm it runs in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// `task_struct.mm`: several tasks share one mm when they are threads.
    pub mm: MmId,
    /// For the thread group leader (the process), the faults its threads'
    /// accesses took: minflt of /proc/PID/stat, the sum of `signal->min_flt`
    /// (exited threads) and every live thread's `min_flt`, as
    /// `do_task_stat` adds them. A thread's faults are counted at its
    /// leader (the sum is all the model reports); a thread's own is 0.
    pub min_flt: u64,
    /// `thread_group_leader()`: a process (spawned, forked), not a thread
    /// made by `clone_thread`. Only leaders have per-process counters.
    pub leader: bool,
}

/// The mm_structs of the machine by id. An mm an operation took out
/// (`take`) keeps its entry, empty, until `put` (no allocation either way).
#[derive(Default)]
pub struct Mms {
    map: BTreeMap<MmId, Option<Box<MmStruct>>>,
    /// The last mm_id handed out (0 is MM_ID_DUMMY).
    last_id: MmId,
    /// `with_mms` has lent the table out (a nested walk would see nothing).
    lent: bool,
}

impl Mms {
    /// mm_alloc: a new, empty mm with a fresh id, in the table.
    pub fn alloc(&mut self) -> MmId {
        self.last_id += 1;
        debug_assert_ne!(self.last_id, MM_ID_DUMMY);
        let mm = Box::new(MmStruct::new(self.last_id));
        self.map.insert(self.last_id, Some(mm));
        self.last_id
    }

    /// Mm `id`, unless it was freed or is taken out.
    pub fn get(&self, id: MmId) -> Option<&MmStruct> {
        self.map.get(&id)?.as_deref()
    }

    pub fn get_mut(&mut self, id: MmId) -> Option<&mut MmStruct> {
        self.map.get_mut(&id)?.as_deref_mut()
    }

    /// Takes mm `id` out of the table for an operation on it (see the
    /// module doc); `put` gives it back.
    pub fn take(&mut self, id: MmId) -> Box<MmStruct> {
        let slot = self.map.get_mut(&id).expect("the mm exists");
        slot.take().expect("the mm is in the table")
    }

    /// Puts back an mm `take` took out.
    pub fn put(&mut self, mm: Box<MmStruct>) {
        let slot = self.map.get_mut(&mm.mm_id).expect("the mm exists");
        debug_assert!(slot.is_none(), "an mm put back twice");
        *slot = Some(mm);
    }

    /// Frees a torn-down mm (`__mmdrop`).
    pub fn free(&mut self, id: MmId) {
        self.map.remove(&id);
    }

    /// The mms in the table (not taken out), by id.
    pub fn iter(&self) -> impl Iterator<Item = &MmStruct> {
        self.map.values().filter_map(|mm| mm.as_deref())
    }

    /// The mms allocated and not freed (taken out ones included).
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The mms a walk may reach: the table and the mm at hand (taken out of it
/// by the operation that runs the walk).
pub struct MmList<'a> {
    table: &'a mut BTreeMap<MmId, Option<Box<MmStruct>>>,
    at_hand: Option<&'a mut MmStruct>,
}

impl MmList<'_> {
    pub fn get_mut(&mut self, id: MmId) -> Option<&mut MmStruct> {
        match &mut self.at_hand {
            Some(mm) if mm.mm_id == id => Some(&mut **mm),
            _ => self.table.get_mut(&id)?.as_deref_mut(),
        }
    }

    /// Every reachable mm: the table's by id, then the one at hand.
    pub fn iter(&self) -> impl Iterator<Item = &MmStruct> {
        let table = self.table.values().filter_map(|mm| mm.as_deref());
        table.chain(self.at_hand.as_deref())
    }

    /// `iter`, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut MmStruct> {
        let table = self.table.values_mut().filter_map(|mm| mm.as_deref_mut());
        table.chain(self.at_hand.as_deref_mut())
    }
}

impl Machine {
    /// Runs `f` with every mm of the machine reachable: those in the table
    /// and `at_hand`, the one the caller took out to work on.
    pub fn with_mms<T>(
        &mut self,
        at_hand: Option<&mut MmStruct>,
        f: impl FnOnce(&mut Machine, &mut MmList) -> T,
    ) -> T {
        debug_assert!(!self.mms.lent, "a walk inside a walk sees no mm");
        let mut table = std::mem::take(&mut self.mms.map);
        self.mms.lent = true;
        let mut list = MmList {
            table: &mut table,
            at_hand,
        };
        let out = f(self, &mut list);
        debug_assert!(self.mms.map.is_empty(), "an mm allocated during a walk");
        self.mms.map = table;
        self.mms.lent = false;
        out
    }

    /// Runs `f` on mm `id` taken out of the table (see the module doc).
    pub fn with_mm<T>(&mut self, id: MmId, f: impl FnOnce(&mut Machine, &mut MmStruct) -> T) -> T {
        let mut mm = self.mms.take(id);
        let out = f(self, &mut mm);
        self.mms.put(mm);
        out
    }

    /// The tasks using mm `id`, by name.
    pub fn tasks_of(&self, id: MmId) -> impl Iterator<Item = &str> {
        self.tasks
            .iter()
            .filter(move |(_, t)| t.mm == id)
            .map(|(n, _)| n.as_str())
    }

    /// The mm of task `name`.
    pub fn mm_of(&self, name: &str) -> Option<&MmStruct> {
        self.mms.get(self.tasks.get(name)?.mm)
    }

    /// The mm of task `name`, to change.
    pub fn mm_of_mut(&mut self, name: &str) -> Option<&mut MmStruct> {
        let id = self.tasks.get(name)?.mm;
        self.mms.get_mut(id)
    }

    /// The distinct mms of the tasks, in the order of the task list (each
    /// once, at its first task).
    pub fn mm_ids_by_task(&self) -> Vec<MmId> {
        let mut seen = rustc_hash::FxHashSet::default();
        self.tasks
            .values()
            .map(|t| t.mm)
            .filter(|id| seen.insert(*id))
            .collect()
    }
}

/// The `spawn` statement: a new process with an empty address space
/// (`mm_alloc` and its anon_vma), in memory cgroup `cgroup` if given.
pub fn sys_spawn(
    m: &mut Machine,
    stmt: &Stmt,
    proc: &str,
    cgroup: Option<&str>,
) -> Result<(), BackendError> {
    if m.tasks.contains_key(proc) {
        return Err(failed(stmt, format!("process '{proc}' already exists")));
    }
    let memcg = match cgroup {
        Some(cg) => Some(
            m.memcg
                .by_name(cg)
                .ok_or_else(|| failed(stmt, format!("no cgroup '{cg}'")))?,
        ),
        None => None,
    };
    let id = m.mms.alloc();
    if let Some(memcg) = memcg {
        m.memcg.attach(id, memcg);
    }
    m.anon_vmas.alloc(id);
    m.tasks.insert(proc.to_string(), Task::leader(id));
    Ok(())
}

impl Task {
    /// A new process's task (spawn, fork) on mm `mm`.
    pub fn leader(mm: MmId) -> Task {
        Task {
            mm,
            min_flt: 0,
            leader: true,
        }
    }
}

impl Machine {
    /// clone(CLONE_VM | CLONE_THREAD): task `thread` runs in `parent`'s mm
    /// (`copy_mm` takes a reference, `mmget`), in `parent`'s thread group
    /// (`parent` may be a thread of it). The `thread` statement.
    pub fn clone_thread(&mut self, parent: &str, thread: &str) -> Result<(), String> {
        if self.tasks.contains_key(thread) {
            return Err(format!("task '{thread}' already exists"));
        }
        let mm = self
            .tasks
            .get(parent)
            .ok_or(format!("no task '{parent}'"))?
            .mm;
        let task = Task {
            mm,
            min_flt: 0,
            leader: false,
        };
        self.tasks.insert(thread.to_string(), task);
        Ok(())
    }

    /// The thread group leader of task `name` (the process a thread
    /// belongs to; a process is its own), by name.
    pub fn group_leader<'a>(&'a self, name: &'a str) -> Option<&'a str> {
        let task = self.tasks.get(name)?;
        if task.leader {
            return Some(name);
        }
        self.tasks
            .iter()
            .find(|(_, t)| t.mm == task.mm && t.leader)
            .map(|(n, _)| n.as_str())
    }

    /// Counts `faults` of task `name`'s accesses (`mm_account_fault`'s
    /// `current->min_flt++`) where /proc/PID/stat shows them: at its
    /// thread group leader (see [`Task::min_flt`]).
    pub fn account_min_flt(&mut self, name: &str, faults: u64) {
        let leader = self.group_leader(name).map(str::to_string);
        if let Some(task) = leader.and_then(|l| self.tasks.get_mut(&l)) {
            task.min_flt += faults;
        }
    }

    /// The threads of mm `id` other than its leader, by name.
    pub fn threads_of(&self, id: MmId) -> Vec<String> {
        self.tasks
            .iter()
            .filter(|(_, t)| t.mm == id && !t.leader)
            .map(|(n, _)| n.clone())
            .collect()
    }
}
