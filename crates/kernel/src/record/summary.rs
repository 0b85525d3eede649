//! What `hugelab record --summary` prints: per task, who it is (comm,
//! parent, clone flags, the images it exec'd), its faults by error code and
//! its mm syscalls by kind; and the recording's totals.

use super::event::{self, Event, Kind};
use serde::Serialize;
use std::collections::BTreeMap;

/// CLONE_VM, CLONE_VFORK, CLONE_THREAD (include/uapi/linux/sched.h).
pub const CLONE_VM: u64 = 0x100;
pub const CLONE_VFORK: u64 = 0x4000;
pub const CLONE_THREAD: u64 = 0x10000;

/// Faults by x86 error code: 0x4 first read (zero page), 0x6 first write,
/// 0x7 write to a present read-only page (zero page or copy-on-write).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Faults {
    pub read: u64,
    pub write: u64,
    pub write_protect: u64,
    /// Other user error codes (instruction fetches 0x14, ...).
    pub other: u64,
    /// Kernel-mode faults on user addresses.
    pub kernel: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Task {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The task that created it (None for the command itself).
    pub parent: Option<u32>,
    pub clone_flags: Option<u64>,
    /// "thread" (CLONE_THREAD), "vfork", "process" or "command".
    pub kind: &'static str,
    pub execs: Vec<String>,
    pub faults: Faults,
    /// mm syscalls by name.
    pub syscalls: BTreeMap<&'static str, u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    /// By tid, in order of appearance.
    pub tasks: Vec<Task>,
    #[serde(skip)]
    index: BTreeMap<u32, usize>,
}

impl Summary {
    fn task(&mut self, tid: u32, pid: u32) -> &mut Task {
        let n = self.tasks.len();
        let i = *self.index.entry(tid).or_insert(n);
        if i == n {
            self.tasks.push(Task {
                pid,
                tid,
                kind: "command",
                ..Task::default()
            });
        }
        &mut self.tasks[i]
    }

    pub fn add(&mut self, e: &Event) {
        match &e.kind {
            Kind::Fault {
                error_code, user, ..
            } => {
                let f = &mut self.task(e.tid, e.pid).faults;
                match (user, error_code) {
                    (false, _) => f.kernel += 1,
                    (true, 0x4) => f.read += 1,
                    (true, 0x6) => f.write += 1,
                    (true, 0x7) => f.write_protect += 1,
                    (true, _) => f.other += 1,
                }
            }
            Kind::SysEnter { nr, .. } => {
                if let Some(name) =
                    event::syscall_name(*nr).filter(|n| event::MM_SYSCALLS.contains(n))
                {
                    *self.task(e.tid, e.pid).syscalls.entry(name).or_default() += 1;
                }
            }
            Kind::NewTask {
                child,
                comm,
                clone_flags,
            } => {
                let pid = if clone_flags & CLONE_THREAD != 0 {
                    e.pid
                } else {
                    *child
                };
                let t = self.task(*child, pid);
                t.parent = Some(e.tid);
                t.clone_flags = Some(*clone_flags);
                t.kind = if clone_flags & CLONE_THREAD != 0 {
                    "thread"
                } else if clone_flags & CLONE_VFORK != 0 {
                    "vfork"
                } else {
                    "process"
                };
                if t.comm.is_empty() {
                    t.comm = comm.clone();
                }
            }
            Kind::Comm { comm, .. } => self.task(e.tid, e.pid).comm = comm.clone(),
            Kind::Exec { filename, .. } => self.task(e.tid, e.pid).execs.push(filename.clone()),
            _ => {}
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

    #[test]
    fn tasks_faults_and_syscalls() {
        let mut s = Summary::default();
        let fault = |code, user| Kind::Fault {
            addr: 0x1000,
            error_code: code,
            user,
        };
        s.add(&ev(
            10,
            10,
            Kind::Comm {
                comm: "prog".into(),
                exec: true,
            },
        ));
        s.add(&ev(10, 10, fault(6, true)));
        s.add(&ev(10, 10, fault(4, true)));
        s.add(&ev(10, 10, fault(7, true)));
        s.add(&ev(10, 10, fault(2, false)));
        s.add(&ev(
            10,
            10,
            Kind::SysEnter {
                nr: 25,
                args: [0; 6],
            },
        ));
        s.add(&ev(
            10,
            10,
            Kind::SysEnter {
                nr: 59,
                args: [0; 6],
            },
        ));
        s.add(&ev(
            10,
            10,
            Kind::NewTask {
                child: 11,
                comm: "prog".into(),
                clone_flags: 0x3d0f00,
            },
        ));
        s.add(&ev(10, 11, fault(6, true)));
        assert_eq!(s.tasks.len(), 2);
        let root = &s.tasks[0];
        assert_eq!(root.comm, "prog");
        assert_eq!(root.kind, "command");
        assert_eq!(
            root.faults,
            Faults {
                read: 1,
                write: 1,
                write_protect: 1,
                other: 0,
                kernel: 1
            }
        );
        assert_eq!(root.syscalls.get("mremap"), Some(&1));
        assert_eq!(root.syscalls.get("execve"), None, "not an mm syscall");
        let thread = &s.tasks[1];
        assert_eq!((thread.pid, thread.tid, thread.parent), (10, 11, Some(10)));
        assert_eq!(thread.kind, "thread");
        assert_eq!(thread.faults.write, 1);
    }
}
