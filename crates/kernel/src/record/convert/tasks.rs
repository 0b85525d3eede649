//! Who is who in a recording: tasks become processes (one per mm), threads
//! of them, or vfork children borrowing their parent's mm until they exec.
//! Both passes of the conversion run the same tracker over the same events,
//! so a [`ProcId`] means the same process in both.

use super::super::event::{Event, Kind};
use super::super::summary::{CLONE_THREAD, CLONE_VM};
use std::collections::HashMap;

/// A process of the workload, in order of creation.
pub type ProcId = usize;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Task {
    /// The process it belongs to; None for a vfork child before its exec.
    pub proc: Option<ProcId>,
    /// The process whose mm it runs in.
    pub mm: ProcId,
    /// Its number among its process's threads (2, 3, ...); None for the
    /// process's first task.
    pub thread: Option<u32>,
}

#[derive(Clone, Debug, Default)]
pub struct Proc {
    /// Its comm: inherited at fork, replaced at each exec.
    pub comm: String,
    /// Its execs so far (its mm's generation).
    pub execs: u32,
    live: u32,
    threads: u32,
}

/// What an event did to the tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    None,
    /// A process with a new mm of its own: the command's exec, or a vfork
    /// child's (posix_spawn).
    Spawn(ProcId),
    Fork {
        parent: ProcId,
        child: ProcId,
    },
    /// `tid` became thread number `n` of the process.
    Thread {
        proc: ProcId,
        n: u32,
    },
    /// The process exec'd: a new mm.
    Exec(ProcId),
    ThreadExit {
        proc: ProcId,
        n: u32,
    },
    /// The process's last task exited.
    Exit(ProcId),
}

#[derive(Default)]
pub struct Tracker {
    tasks: HashMap<u32, Task>,
    pub procs: Vec<Proc>,
}

impl Tracker {
    pub fn task(&self, tid: u32) -> Option<Task> {
        self.tasks.get(&tid).copied()
    }

    fn new_proc(&mut self, comm: &str) -> ProcId {
        self.procs.push(Proc {
            comm: comm.to_string(),
            live: 1,
            ..Proc::default()
        });
        self.procs.len() - 1
    }

    /// Processes still running (at the end of an interrupted recording).
    pub fn live(&self) -> impl Iterator<Item = ProcId> + '_ {
        (0..self.procs.len()).filter(|&p| self.procs[p].live > 0)
    }

    pub fn apply(&mut self, e: &Event) -> Change {
        match &e.kind {
            Kind::NewTask {
                child, clone_flags, ..
            } => self.new_task(e.tid, *child, *clone_flags),
            Kind::Comm { comm, exec: true } => self.exec(e.tid, comm),
            Kind::Exit { .. } => self.exit(e.tid),
            _ => Change::None,
        }
    }

    fn new_task(&mut self, parent: u32, child: u32, flags: u64) -> Change {
        let Some(p) = self.task(parent) else {
            return Change::None;
        };
        if flags & CLONE_THREAD != 0 {
            let Some(proc) = p.proc else {
                // A vfork child making threads: they borrow the mm too.
                self.tasks.insert(child, Task { thread: None, ..p });
                return Change::None;
            };
            let pr = &mut self.procs[proc];
            pr.live += 1;
            pr.threads += 1;
            let n = pr.threads + 1;
            self.tasks.insert(
                child,
                Task {
                    proc: Some(proc),
                    mm: proc,
                    thread: Some(n),
                },
            );
            Change::Thread { proc, n }
        } else if flags & CLONE_VM != 0 {
            self.tasks.insert(
                child,
                Task {
                    proc: None,
                    mm: p.mm,
                    thread: None,
                },
            );
            Change::None
        } else {
            let comm = self.procs[p.mm].comm.clone();
            let c = self.new_proc(&comm);
            self.tasks.insert(
                child,
                Task {
                    proc: Some(c),
                    mm: c,
                    thread: None,
                },
            );
            Change::Fork {
                parent: p.mm,
                child: c,
            }
        }
    }

    fn exec(&mut self, tid: u32, comm: &str) -> Change {
        match self.task(tid) {
            Some(Task {
                proc: Some(proc), ..
            }) => {
                let pr = &mut self.procs[proc];
                pr.comm = comm.to_string();
                pr.execs += 1;
                // de_thread: the other threads are gone (their exits came first).
                pr.live = 1;
                self.tasks.insert(
                    tid,
                    Task {
                        proc: Some(proc),
                        mm: proc,
                        thread: None,
                    },
                );
                Change::Exec(proc)
            }
            // The command's own exec, or a vfork child's: a process of its own.
            _ => {
                let proc = self.new_proc(comm);
                self.tasks.insert(
                    tid,
                    Task {
                        proc: Some(proc),
                        mm: proc,
                        thread: None,
                    },
                );
                Change::Spawn(proc)
            }
        }
    }

    fn exit(&mut self, tid: u32) -> Change {
        let Some(Task {
            proc: Some(proc),
            thread,
            ..
        }) = self.tasks.remove(&tid)
        else {
            return Change::None;
        };
        let pr = &mut self.procs[proc];
        pr.live = pr.live.saturating_sub(1);
        match (pr.live, thread) {
            (0, _) => Change::Exit(proc),
            (_, Some(n)) => Change::ThreadExit { proc, n },
            // The first task left before its threads: the process goes with the last.
            (_, None) => Change::None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(pid: u32, tid: u32, kind: Kind) -> Event {
        Event {
            time: 0,
            pid,
            tid,
            kind,
        }
    }

    fn comm(c: &str) -> Kind {
        Kind::Comm {
            comm: c.into(),
            exec: true,
        }
    }

    fn newtask(child: u32, clone_flags: u64) -> Kind {
        Kind::NewTask {
            child,
            comm: String::new(),
            clone_flags,
        }
    }

    const EXIT: Kind = Kind::Exit { ppid: 0, ptid: 0 };

    #[test]
    fn fork_thread_vfork_exec_and_exit() {
        let mut t = Tracker::default();
        assert_eq!(t.apply(&ev(10, 10, comm("make"))), Change::Spawn(0));
        assert_eq!(
            t.apply(&ev(10, 10, newtask(11, 0x11))),
            Change::Fork {
                parent: 0,
                child: 1
            }
        );
        assert_eq!(t.procs[1].comm, "make");
        assert_eq!(t.apply(&ev(11, 11, comm("cc1"))), Change::Exec(1));
        assert_eq!(
            t.apply(&ev(11, 11, newtask(12, 0x3d0f00))),
            Change::Thread { proc: 1, n: 2 }
        );
        // posix_spawn: CLONE_VM|CLONE_VFORK, then its exec is a new process.
        assert_eq!(t.apply(&ev(10, 10, newtask(13, 0x4111))), Change::None);
        assert_eq!(t.task(13).unwrap().mm, 0);
        assert_eq!(t.apply(&ev(13, 13, comm("as"))), Change::Spawn(2));
        assert_eq!(
            t.apply(&ev(11, 12, EXIT)),
            Change::ThreadExit { proc: 1, n: 2 }
        );
        assert_eq!(t.apply(&ev(11, 11, EXIT)), Change::Exit(1));
        assert_eq!(t.live().collect::<Vec<_>>(), vec![0, 2]);
    }
}
