//! Each process's own figures at the end of each of its address spaces,
//! read by the recorder while that mm still exists: its minor faults
//! (/proc/PID/stat field 10, the thread group's: its live threads' and the
//! dead ones' `signal->min_flt`), its anonymous and shmem memory (RssAnon
//! and RssShmem of /proc/PID/task/TID/status).
//!
//! The mechanism: ptrace. The command is seized before its exec
//! (PTRACE_SEIZE with TRACEFORK, TRACEVFORK, TRACECLONE, so every
//! descendant is traced from birth; TRACEEXIT to stop each task in
//! `do_exit` before `exit_mm`; TRACEEXEC; EXITKILL, so the tree dies with
//! the recorder). The mm an exec replaces is gone when PTRACE_EVENT_EXEC is
//! reported, so the command's tree runs under a seccomp filter that asks
//! the tracer to look at every execve/execveat at its entry
//! (SECCOMP_RET_TRACE, PTRACE_O_TRACESECCOMP): the reading taken there is
//! the old mm's if PTRACE_EVENT_EXEC follows for that task, and is dropped
//! if the exec fails. Every other stop is passed through as strace does: a
//! signal-delivery stop is resumed with its signal, a group-stop is kept
//! stopped with PTRACE_LISTEN, a new task's first stop waits until its
//! parent's fork/clone event says what it is.
//!
//! An mm's figures are those of the process that owns it: a thread's exit
//! is read like the last one's (the latest reading of an mm wins, so its
//! value is the one at the last task's exit, or at the exit_group caller's:
//! the other threads, killed by it, do not stop). The minflt of an mm is the
//! process's count at its end less its count at its start (its fork, or the
//! exec that made it): the count is per task and survives exec. What the
//! workload has no process for is not reported: the command before its
//! exec (hugelab's own child) and a vfork child before its exec: it runs in
//! its parent's mm, and its faults there, counted in its own minflt, are
//! added to that mm's (the workload has them in the parent's process). A
//! task the kernel kills (SIGKILL) does not stop at its exit: its mm is not
//! read. 32-bit (compat) execs are not stopped at: the mm
//! before one is not read, and the next mm's minflt starts at the count
//! after the exec.
//!
//! RssAnon and RssShmem are exact in 6.18: fs/proc/task_mmu.c `task_mem`
//! reads them with `get_mm_counter_sum` (`percpu_counter_sum_positive` of
//! the mm's `rss_stat`, every CPU's part folded in; since 6.16, "mm: fix the
//! inaccurate memory statistics issue for users"), not with
//! `get_mm_counter`'s per-CPU approximation, which was off by up to the
//! counter's batch per CPU.

use super::settings::{SettingRead, Watch};
use crate::error::{KernelError, Result};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Mutex;

const PTRACE_EVENT_FORK: i32 = 1;
const PTRACE_EVENT_VFORK: i32 = 2;
const PTRACE_EVENT_CLONE: i32 = 3;
const PTRACE_EVENT_EXEC: i32 = 4;
const PTRACE_EVENT_EXIT: i32 = 6;
const PTRACE_EVENT_SECCOMP: i32 = 7;
const PTRACE_EVENT_STOP: i32 = 128;

const OPTIONS: libc::c_int = libc::PTRACE_O_TRACEFORK
    | libc::PTRACE_O_TRACEVFORK
    | libc::PTRACE_O_TRACECLONE
    | libc::PTRACE_O_TRACEEXEC
    | libc::PTRACE_O_TRACEEXIT
    | libc::PTRACE_O_TRACESECCOMP
    | libc::PTRACE_O_EXITKILL;

/// The seccomp program of the recorded tree: execve (59) and execveat
/// (322) of x86-64 stop for the tracer at their entry; everything else is
/// allowed.
pub const EXEC_FILTER: [libc::sock_filter; 7] = [
    // ld [4]: seccomp_data.arch
    bpf(0x20, 0, 0, 4),
    // jeq AUDIT_ARCH_X86_64, else allow
    bpf(0x15, 0, 3, 0xc000_003e),
    // ld [0]: seccomp_data.nr
    bpf(0x20, 0, 0, 0),
    bpf(0x15, 2, 0, 59),
    bpf(0x15, 1, 0, 322),
    // ret SECCOMP_RET_ALLOW
    bpf(0x06, 0, 0, 0x7fff_0000),
    // ret SECCOMP_RET_TRACE
    bpf(0x06, 0, 0, 0x7ff0_0000),
];

const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// One address space of one process of the workload, as it ended.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MmStat {
    pub pid: u32,
    /// Which of the workload's processes with this pid (0 the first; a pid
    /// the kernel reuses within the recording names another process).
    pub incarnation: u32,
    /// The process's execs before this mm (0: its first mm in the workload).
    pub generation: u32,
    /// "exit" or "exec": what ended it.
    pub ended_by: &'static str,
    /// The process's name then (its comm).
    pub comm: String,
    /// Minor faults the process took in this mm (from the fork or exec that
    /// made it to its end).
    pub minflt: u64,
    /// RssAnon at its end, kB.
    pub anon_kb: u64,
    /// RssShmem at its end, kB.
    pub shmem_kb: u64,
}

#[derive(Clone, Debug, Default)]
struct Reading {
    minflt: u64,
    anon_kb: u64,
    shmem_kb: u64,
    comm: String,
}

#[derive(Debug, Default)]
struct Proc {
    /// None while the workload has no process for it (the command before
    /// its exec, a vfork child before its exec).
    incarnation: Option<u32>,
    generation: u32,
    /// The minflt count when this mm began.
    base: u64,
    /// Its latest reading at a task's exit.
    last: Option<Reading>,
    /// Its traced tasks not yet reaped.
    tasks: u32,
    /// A vfork child before its exec: the process whose mm it runs in.
    lender: Option<u32>,
    /// Minor faults its vfork children took in this mm before their exec
    /// (counted in their own minflt, but the workload has them here).
    borrowed: u64,
}

/// Every traced task (for the signal path, which runs on another thread).
static TRACED: Mutex<Option<HashSet<libc::pid_t>>> = Mutex::new(None);

fn traced(f: impl FnOnce(&mut HashSet<libc::pid_t>)) {
    let mut t = TRACED.lock().unwrap_or_else(|p| p.into_inner());
    f(t.get_or_insert_with(HashSet::new));
}

/// SIGKILLs every task the recorder traces (the signal path's cleanup).
pub fn kill_traced() {
    traced(|t| {
        for &tid in t.iter() {
            // SAFETY: signals a task of the recorded tree.
            unsafe { libc::kill(tid, libc::SIGKILL) };
        }
    });
}

/// The read end of the pipe SIGCHLD writes to: a tracee's stop wakes the
/// recorder's poll at once.
static SIGCHLD_PIPE: [AtomicI32; 2] = [AtomicI32::new(-1), AtomicI32::new(-1)];

extern "C" fn on_sigchld(_: libc::c_int) {
    // SAFETY: async-signal-safe: write(2) to a non-blocking pipe; errno kept.
    unsafe {
        let errno = libc::__errno_location();
        let saved = *errno;
        let fd = SIGCHLD_PIPE[1].load(Ordering::Relaxed);
        if fd >= 0 {
            libc::write(fd, [0u8].as_ptr().cast(), 1);
        }
        *errno = saved;
    }
}

/// The tracer of the recorded tree.
pub struct Tracer {
    root: libc::pid_t,
    /// The process (thread group) of each traced task.
    tgid: HashMap<u32, u32>,
    procs: HashMap<u32, Proc>,
    /// Readings at an exec's entry, by task, until the exec is reported.
    exec_entry: HashMap<u32, Reading>,
    /// New tasks stopped before their parent's event said what they are.
    held: HashSet<u32>,
    /// Incarnations given out, by pid.
    births: HashMap<u32, u32>,
    pub stats: Vec<MmStat>,
    pub root_status: Option<i32>,
    /// The command has exec'd (its recording has begun).
    pub root_execed: bool,
    old_sigchld: Option<libc::sigaction>,
    /// The reads of the THP settings, if watched ([`super::settings`]).
    watch: Option<Watch>,
    /// Each process's reads, once each, in the order first seen.
    pub reads: Vec<SettingRead>,
}

impl Tracer {
    /// A tracer with its SIGCHLD wake-up pipe; nothing traced yet.
    pub fn new() -> Result<Tracer> {
        let mut fds = [0; 2];
        // SAFETY: fds has room for two descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(os_error("pipe2"));
        }
        SIGCHLD_PIPE[0].store(fds[0], Ordering::SeqCst);
        SIGCHLD_PIPE[1].store(fds[1], Ordering::SeqCst);
        // SAFETY: plain sigaction with zeroed structs; the old one is kept.
        let old = unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigchld as extern "C" fn(libc::c_int) as libc::sighandler_t;
            new.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(libc::SIGCHLD, &new, &mut old) == 0).then_some(old)
        };
        Ok(Tracer {
            root: 0,
            tgid: HashMap::new(),
            procs: HashMap::new(),
            exec_entry: HashMap::new(),
            held: HashSet::new(),
            births: HashMap::new(),
            stats: Vec::new(),
            root_status: None,
            root_execed: false,
            old_sigchld: old,
            watch: None,
            reads: Vec::new(),
        })
    }

    /// The descriptor a poll waits on for tracee stops and exits.
    pub fn wake_fd(&self) -> libc::c_int {
        SIGCHLD_PIPE[0].load(Ordering::SeqCst)
    }

    /// Empties the wake-up pipe.
    pub fn drain_wake(&self) {
        let mut buf = [0u8; 256];
        // SAFETY: reads into a local buffer from our non-blocking pipe.
        while unsafe { libc::read(self.wake_fd(), buf.as_mut_ptr().cast(), buf.len()) } > 0 {}
    }

    /// Notes the tree's reads of the files `watch` watches.
    pub fn watch_settings(&mut self, watch: Watch) {
        self.watch = Some(watch);
    }

    /// Whether the settings' queue overflowed (some reads not reported).
    pub fn reads_overflowed(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.overflowed)
    }

    /// Takes the reads reported so far, naming each reader by its pid's
    /// incarnation. Called every round and at each task's exit stop, while
    /// the process still holds its pid: a pid is reused only once reaped,
    /// so a read is never given to a later process with the same pid.
    pub fn note_reads(&mut self) {
        let Some(watch) = &mut self.watch else {
            return;
        };
        let mut drained = Vec::new();
        watch.drain(|pid, path| drained.push((pid, path)));
        for (pid, path) in drained {
            let Some((pid, incarnation)) = self.process_of(pid) else {
                continue;
            };
            let read = SettingRead {
                pid,
                incarnation,
                path,
            };
            if !self.reads.contains(&read) {
                self.reads.push(read);
            }
        }
    }

    /// The workload's process (pid, incarnation) of thread group `tgid`: a
    /// vfork child before its exec is its parent's (it runs in its mm);
    /// None for a task not traced or the command before its exec.
    fn process_of(&self, tgid: u32) -> Option<(u32, u32)> {
        let p = self.procs.get(&tgid)?;
        match (p.incarnation, p.lender) {
            (Some(i), _) => Some((tgid, i)),
            (None, Some(lender)) => Some((lender, self.procs.get(&lender)?.incarnation?)),
            (None, None) => None,
        }
    }

    /// Seizes the command (forked, not yet exec'd).
    pub fn seize(&mut self, root: libc::pid_t) -> Result<()> {
        // SAFETY: PTRACE_SEIZE of our own child with its options.
        let r = unsafe {
            libc::ptrace(
                libc::PTRACE_SEIZE,
                root,
                std::ptr::null_mut::<libc::c_void>(),
                OPTIONS as libc::c_ulong,
            )
        };
        if r != 0 {
            return Err(KernelError::Refused(format!(
                "cannot trace the command (PTRACE_SEIZE): {}",
                io::Error::last_os_error()
            )));
        }
        self.root = root;
        let pid = root as u32;
        self.tgid.insert(pid, pid);
        self.procs.insert(
            pid,
            Proc {
                tasks: 1,
                ..Proc::default()
            },
        );
        traced(|t| {
            t.clear();
            t.insert(root);
        });
        Ok(())
    }

    /// Handles every wait status there is without blocking; returns whether
    /// any task is left to wait for.
    pub fn reap(&mut self) -> bool {
        loop {
            let mut status = 0;
            // SAFETY: waits for any child or tracee without blocking.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid == 0 {
                return true;
            }
            if pid < 0 {
                return io::Error::last_os_error().raw_os_error() != Some(libc::ECHILD);
            }
            self.on_status(pid, status);
        }
    }

    /// Waits for the command's own next status (blocking); false once it
    /// has gone.
    pub fn wait_root(&mut self) -> bool {
        let mut status = 0;
        // SAFETY: waits for our child.
        let pid = unsafe { libc::waitpid(self.root, &mut status, libc::__WALL) };
        if pid != self.root {
            return false;
        }
        self.on_status(pid, status);
        !(libc::WIFEXITED(status) || libc::WIFSIGNALED(status))
    }

    fn on_status(&mut self, pid: libc::pid_t, status: libc::c_int) {
        if libc::WIFEXITED(status) || libc::WIFSIGNALED(status) {
            if pid == self.root {
                self.root_status = Some(if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else {
                    128 + libc::WTERMSIG(status)
                });
            }
            self.gone(pid as u32);
            return;
        }
        if !libc::WIFSTOPPED(status) {
            return;
        }
        let tid = pid as u32;
        let sig = libc::WSTOPSIG(status);
        let event = status >> 16;
        if !self.tgid.contains_key(&tid) {
            // A new task's first stop before its parent's fork/clone event.
            self.held.insert(tid);
            traced(|t| {
                t.insert(pid);
            });
            return;
        }
        match event {
            PTRACE_EVENT_FORK | PTRACE_EVENT_VFORK | PTRACE_EVENT_CLONE => {
                if let Some(child) = event_msg(pid) {
                    self.born(tid, child as u32, event);
                }
                resume(pid, 0);
            }
            PTRACE_EVENT_SECCOMP => {
                if let Some(r) = self.read(tid) {
                    self.exec_entry.insert(tid, r);
                }
                resume(pid, 0);
            }
            PTRACE_EVENT_EXEC => {
                let former = event_msg(pid).map_or(tid, |m| m as u32);
                self.exec(tid, former);
                resume(pid, 0);
            }
            PTRACE_EVENT_EXIT => {
                self.note_reads();
                self.exec_entry.remove(&tid);
                let tgid = self.tgid[&tid];
                if self
                    .procs
                    .get(&tgid)
                    .is_some_and(|p| p.incarnation.is_some() || p.lender.is_some())
                {
                    if let Some(r) = self.read(tid) {
                        self.procs.get_mut(&tgid).expect("known").last = Some(r);
                    }
                }
                resume(pid, 0);
            }
            PTRACE_EVENT_STOP => {
                if sig == libc::SIGTRAP {
                    // A new task's first stop (or a PTRACE_INTERRUPT).
                    resume(pid, 0);
                } else {
                    // A group-stop: stays stopped until SIGCONT, as without us.
                    // SAFETY: PTRACE_LISTEN on a tracee in group-stop.
                    unsafe { libc::ptrace(libc::PTRACE_LISTEN, pid, 0, 0) };
                }
            }
            // A signal-delivery stop: the signal goes on to the tracee.
            0 => resume(pid, sig),
            _ => resume(pid, 0),
        }
    }

    /// `parent` made `child` (fork, vfork or clone).
    fn born(&mut self, parent: u32, child: u32, event: i32) {
        let parent_tgid = self.tgid.get(&parent).copied().unwrap_or(parent);
        let tgid = status_field(child, child, "Tgid:").map_or(child, |t| t as u32);
        traced(|t| {
            t.insert(child as libc::pid_t);
        });
        if tgid != child {
            // A thread.
            self.tgid.insert(child, parent_tgid);
            if let Some(p) = self.procs.get_mut(&parent_tgid) {
                p.tasks += 1;
            }
        } else {
            self.tgid.insert(child, child);
            // A vfork child runs in its parent's mm until its exec.
            let vfork = event == PTRACE_EVENT_VFORK;
            let incarnation = (!vfork).then(|| self.birth(child));
            self.procs.insert(
                child,
                Proc {
                    incarnation,
                    tasks: 1,
                    lender: vfork.then_some(parent_tgid),
                    ..Proc::default()
                },
            );
        }
        if self.held.remove(&child) {
            resume(child as libc::pid_t, 0);
        }
    }

    fn birth(&mut self, pid: u32) -> u32 {
        let n = self.births.entry(pid).or_default();
        *n += 1;
        *n - 1
    }

    /// Thread group `tgid` exec'd, in its task `former` (now `tgid`).
    fn exec(&mut self, tgid: u32, former: u32) {
        let entry = self.exec_entry.remove(&former);
        if former != tgid {
            // The exec'ing thread took the leader's tid; the old leader is
            // gone without a report.
            self.tgid.remove(&former);
            traced(|t| {
                t.remove(&(former as libc::pid_t));
            });
            if let Some(p) = self.procs.get_mut(&tgid) {
                p.tasks = p.tasks.saturating_sub(1);
            }
        }
        if tgid as libc::pid_t == self.root {
            self.root_execed = true;
        }
        let base = match &entry {
            Some(r) => r.minflt,
            // Not stopped at its entry (a compat exec): from now on.
            None => read_minflt(tgid).unwrap_or(0),
        };
        let fresh = self
            .procs
            .get(&tgid)
            .is_some_and(|p| p.incarnation.is_none());
        if let (true, Some(r)) = (fresh, &entry) {
            self.lend(tgid, r.minflt);
        }
        let incarnation = fresh.then(|| self.birth(tgid));
        let Some(p) = self.procs.get_mut(&tgid) else {
            return;
        };
        if let Some(i) = incarnation {
            p.incarnation = Some(i);
        } else if let (Some(i), Some(r)) = (p.incarnation, entry) {
            self.stats.push(MmStat {
                pid: tgid,
                incarnation: i,
                generation: p.generation,
                ended_by: "exec",
                comm: r.comm,
                minflt: r.minflt.saturating_sub(p.base) + p.borrowed,
                anon_kb: r.anon_kb,
                shmem_kb: r.shmem_kb,
            });
            p.generation += 1;
        } else {
            p.generation += 1;
        }
        p.base = base;
        p.last = None;
        p.borrowed = 0;
    }

    /// A vfork child `tgid` leaves its parent's mm (exec or exit) with
    /// `minflt` counted: what it took there goes to the parent's mm.
    fn lend(&mut self, tgid: u32, minflt: u64) {
        let Some(p) = self.procs.get_mut(&tgid) else {
            return;
        };
        let Some(lender) = p.lender.take() else {
            return;
        };
        let took = minflt.saturating_sub(p.base);
        if let Some(l) = self.procs.get_mut(&lender) {
            l.borrowed += took;
        }
    }

    /// Task `tid` was reaped.
    fn gone(&mut self, tid: u32) {
        self.exec_entry.remove(&tid);
        self.held.remove(&tid);
        traced(|t| {
            t.remove(&(tid as libc::pid_t));
        });
        let Some(tgid) = self.tgid.remove(&tid) else {
            return;
        };
        let done = self.procs.get_mut(&tgid).is_some_and(|p| {
            p.tasks = p.tasks.saturating_sub(1);
            p.tasks == 0
        });
        if done {
            let p = self.procs.remove(&tgid).expect("known");
            self.flush(tgid, p);
        }
    }

    fn flush(&mut self, tgid: u32, p: Proc) {
        if let (Some(lender), Some(r)) = (p.lender, &p.last) {
            // A vfork child that exited without exec.
            if let Some(l) = self.procs.get_mut(&lender) {
                l.borrowed += r.minflt.saturating_sub(p.base);
            }
        }
        if let (Some(i), Some(r)) = (p.incarnation, p.last) {
            self.stats.push(MmStat {
                pid: tgid,
                incarnation: i,
                generation: p.generation,
                ended_by: "exit",
                comm: r.comm,
                minflt: r.minflt.saturating_sub(p.base) + p.borrowed,
                anon_kb: r.anon_kb,
                shmem_kb: r.shmem_kb,
            });
        }
    }

    /// The figures of `tid`'s process while its mm exists.
    fn read(&self, tid: u32) -> Option<Reading> {
        let tgid = *self.tgid.get(&tid)?;
        let status = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/status")).ok()?;
        let kb = |name: &str| field(&status, name).unwrap_or(0);
        Some(Reading {
            minflt: read_minflt(tgid)?,
            anon_kb: kb("RssAnon:"),
            shmem_kb: kb("RssShmem:"),
            comm: status
                .lines()
                .find_map(|l| l.strip_prefix("Name:"))
                .map_or_else(String::new, |n| n.trim().to_string()),
        })
    }

    /// The readings of every process, in the order their mms ended (those
    /// still there, after an interrupted recording, last).
    pub fn finish(mut self) -> Vec<MmStat> {
        let left: Vec<(u32, Proc)> = self.procs.drain().collect();
        for (tgid, p) in left {
            self.flush(tgid, p);
        }
        std::mem::take(&mut self.stats)
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Some(old) = self.old_sigchld.take() {
            // SAFETY: puts back the disposition we replaced.
            unsafe { libc::sigaction(libc::SIGCHLD, &old, std::ptr::null_mut()) };
        }
        for end in &SIGCHLD_PIPE {
            let fd = end.swap(-1, Ordering::SeqCst);
            if fd >= 0 {
                // SAFETY: closes our pipe.
                unsafe { libc::close(fd) };
            }
        }
        traced(|t| t.clear());
    }
}

fn resume(pid: libc::pid_t, sig: libc::c_int) {
    // SAFETY: resumes a stopped tracee (ESRCH if it was killed meanwhile).
    unsafe { libc::ptrace(libc::PTRACE_CONT, pid, 0, sig as libc::c_ulong) };
}

fn event_msg(pid: libc::pid_t) -> Option<libc::c_ulong> {
    let mut msg: libc::c_ulong = 0;
    // SAFETY: PTRACE_GETEVENTMSG writes one unsigned long.
    let r = unsafe { libc::ptrace(libc::PTRACE_GETEVENTMSG, pid, 0, &mut msg) };
    (r == 0).then_some(msg)
}

/// /proc/PID/stat field 10 of the thread group: its threads' minor faults.
fn read_minflt(tgid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/stat")).ok()?;
    crate::process::stat_minflt(&s)
}

/// The first number of a `Name:   value` line.
fn field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

fn status_field(tgid: u32, tid: u32, name: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{tgid}/task/{tid}/status")).ok()?;
    field(&s, name)
}

fn os_error(what: &str) -> KernelError {
    KernelError::Refused(format!("{what} failed: {}", io::Error::last_os_error()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_in_kb() {
        let s = "Name:\tpython3\nRssAnon:\t    9876 kB\nRssShmem:\t       0 kB\n";
        assert_eq!(field(s, "RssAnon:"), Some(9876));
        assert_eq!(field(s, "RssShmem:"), Some(0));
        assert_eq!(field(s, "RssFile:"), None);
    }

    #[test]
    fn the_filter_traces_execve_and_execveat_only() {
        // A tiny interpreter of the filter's instructions.
        let run = |arch: u32, nr: u32| {
            let mut acc = 0u32;
            let mut pc = 0usize;
            loop {
                let i = EXEC_FILTER[pc];
                match i.code {
                    0x20 => acc = if i.k == 4 { arch } else { nr },
                    0x15 => {
                        pc += usize::from(if acc == i.k { i.jt } else { i.jf });
                    }
                    0x06 => return i.k,
                    c => panic!("unexpected code {c:#x}"),
                }
                pc += 1;
            }
        };
        const X86_64: u32 = 0xc000_003e;
        assert_eq!(run(X86_64, 59), 0x7ff0_0000);
        assert_eq!(run(X86_64, 322), 0x7ff0_0000);
        assert_eq!(run(X86_64, 9), 0x7fff_0000);
        assert_eq!(run(0x4000_0003, 11), 0x7fff_0000, "i386: allowed");
    }
}
