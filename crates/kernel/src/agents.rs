//! The workload's processes as they run on the kernel: each a live agent
//! ([`crate::process`]) with its regions, and the requests a statement's
//! handler sends them, with what killed one if something did.

use crate::call::{failed, Call, Killed};
use crate::error::KernelError;
use crate::process::AgentProc;
use crate::protocol::Request;
use hugelab_workload::mapped::Mapped;
use hugelab_workload::{BackendError, Range, Signal, Stmt};
use std::collections::BTreeMap;

/// One of the workload's regions: where it is and what of it is still mapped.
#[derive(Clone)]
pub(crate) struct Region {
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) mapped: Mapped,
    /// Private anonymous memory (not a file, shared or HugeTLB mapping):
    /// its folios are anonymous ones, counted by the mTHP and THP counters.
    pub(crate) anon: bool,
    /// A private file mapping: the pages written in it are anonymous
    /// (copied on write) among the file's.
    pub(crate) private_file: bool,
}

/// One of the workload's processes: its agent and its regions.
pub(crate) struct Proc {
    pub(crate) agent: AgentProc,
    /// The regions that exist (a region fully unmapped is gone).
    pub(crate) regions: BTreeMap<String, Region>,
    /// Where the next region goes (`placement::place_region`).
    pub(crate) cursor: u64,
    /// Faults taken by the workload's accesses (getrusage around the loop).
    pub(crate) minflt: i64,
    /// The directory of the memory cgroup the agent is in, if the workload
    /// put it in one (a forked agent is in its parent's).
    pub(crate) memcg_dir: Option<std::path::PathBuf>,
    /// Whether that group is one of the workload's own (`cgroup`), whose
    /// limit may make its statements reclaim, not the run's own group.
    pub(crate) workload_memcg: bool,
    /// How far its fixed (`at=`) addresses are moved on the kernel, decided
    /// at its first one ([`crate::relocate`]); a fork inherits it.
    pub(crate) shift: Option<i64>,
    /// Why its page tables are not its own alone: a fixed address of it
    /// shares page-table pages with the agent's own mappings
    /// ([`crate::relocate`]).
    pub(crate) shared_tables: Option<String>,
    /// Its live threads by name, each with a channel of its own.
    pub(crate) threads: BTreeMap<String, AgentProc>,
    /// The pages of each special mapping (vdso, vvar, vvar_vclock) the
    /// workload's `special` reads have mapped in it, as a fresh program's
    /// would have them ([`crate::memory::special`] checks the agent's).
    pub(crate) special_ptes: [u64; 3],
    /// Why its `stat.<proc>.minflt` is unknown, if it is: an agent whose
    /// special mappings were not a fresh program's.
    pub(crate) minflt_unknown: Option<String>,
}

impl Proc {
    /// A new process: `agent`, with `regions` (a fork child's copies).
    pub(crate) fn new(agent: AgentProc, regions: BTreeMap<String, Region>) -> Proc {
        Proc {
            agent,
            regions,
            cursor: 0,
            minflt: 0,
            memcg_dir: None,
            workload_memcg: false,
            threads: BTreeMap::new(),
            shift: None,
            shared_tables: None,
            special_ptes: [0; 3],
            minflt_unknown: None,
        }
    }
}

/// The workload's processes by name, each a live agent: what a window's
/// statement runs against.
#[derive(Default)]
pub(crate) struct Agents {
    pub(crate) procs: BTreeMap<String, Proc>,
    /// The process of each live thread, by the thread's name.
    pub(crate) thread_of: BTreeMap<String, String>,
    /// The workload's files, as memfds the agents map (see `filemap`).
    pub(crate) files: crate::filemap::Files,
}

/// Whether the memcg OOM killer killed in `p`'s group since it read
/// `before`.
fn oom_killed(p: &Proc, before: Option<u64>) -> bool {
    let now = p.memcg_dir.as_deref().and_then(crate::memcg::oom_kills_at);
    matches!((before, now), (Some(b), Some(n)) if n > b)
}

impl Agents {
    /// The agent other than `proc` in the memory cgroup at `dir` that the
    /// OOM killer killed (its oom_kill count moved while `proc` ran and
    /// `proc` lives): one that is dead, waited for up to five seconds (a
    /// busy machine can take a while to finish the exit).
    fn oom_victim(&self, proc: &str, dir: Option<&std::path::Path>) -> Option<Killed> {
        let dir = dir?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let dead = self.procs.iter().find(|(name, p)| {
                name.as_str() != proc
                    && p.memcg_dir.as_deref() == Some(dir)
                    && crate::process::exited(p.agent.pid)
            });
            if let Some((name, _)) = dead {
                return Some(Killed {
                    proc: name.clone(),
                    signal: Signal::SIGKILL,
                    message: format!(
                        "{name} was killed by SIGKILL (the memcg OOM killer chose it while {proc} faulted in their memory cgroup)"
                    ),
                });
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// The process task `name` is (or the process of thread `name`).
    pub(crate) fn get_mut(&mut self, stmt: &Stmt, name: &str) -> Result<&mut Proc, BackendError> {
        let proc = self.thread_of.get(name).map_or(name, String::as_str);
        self.procs
            .get_mut(proc)
            .ok_or_else(|| failed(stmt, format!("no process '{name}'")))
    }

    /// The process whose task `name` is: itself, or a thread's process.
    pub(crate) fn process_of<'a>(&'a self, name: &'a str) -> &'a str {
        self.thread_of.get(name).map_or(name, String::as_str)
    }

    /// Forgets the threads of `proc` (exit_group, exec's de_thread): their
    /// channels close.
    pub(crate) fn end_threads(&mut self, proc: &str) {
        self.thread_of.retain(|_, p| p != proc);
        if let Some(p) = self.procs.get_mut(proc) {
            p.threads.clear();
        }
    }

    /// Sends `req` to the agent of `proc`: the value it returned, and the
    /// call. An agent killed by SIGBUS or SIGKILL is a call that killed
    /// `proc` (a workload outcome); by SIGSEGV, an access the workload
    /// should not make, it stops the run, as on the model.
    pub(crate) fn request(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        req: Request,
    ) -> Result<(i64, Call), BackendError> {
        self.request_passing(stmt, proc, req, None)
    }

    /// [`Agents::request`], passing the descriptor `pass` with the request.
    pub(crate) fn request_passing(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        req: Request,
        pass: Option<std::os::fd::RawFd>,
    ) -> Result<(i64, Call), BackendError> {
        let p = self.get_mut(stmt, proc)?;
        let oom_kills_before = p.memcg_dir.as_deref().and_then(crate::memcg::oom_kills_at);
        let killed = |signal: i32, how: String| {
            let signal = Signal(signal);
            if signal == Signal::SIGSEGV {
                return Err(failed(stmt, format!("SIGSEGV: {proc} was killed ({how})")));
            }
            Ok(Some(Killed {
                proc: proc.to_string(),
                signal,
                message: format!("{proc} was killed by {signal} ({how})"),
            }))
        };
        let reply = match p.channel(proc).request_passing(req, pass) {
            Ok(reply) => reply,
            Err(KernelError::Killed {
                signal,
                message,
                faults,
            }) => {
                // No last word: its faults come from its rusage where known
                // (a spawned agent), plus the fault that failed: the memcg
                // OOM killer's victim dies of a fault that returned
                // VM_FAULT_OOM, which mm_account_fault counts in PGFAULT
                // only.
                let oom = signal == libc::SIGKILL;
                let message = if oom && oom_killed(p, oom_kills_before) {
                    format!("{message}; the OOM killer of its memory cgroup chose it")
                } else {
                    message
                };
                let call = Call {
                    killed: killed(signal, message)?,
                    ..Call::ok(faults.map_or(0, |f| f + i64::from(oom)))
                };
                return Ok((0, call));
            }
            Err(KernelError::Agent(message)) if oom_killed(p, oom_kills_before) => {
                // A forked agent is reaped by its parent agent, so its exit
                // status is lost; the memcg OOM killer's count says it was
                // killed by SIGKILL (oom_kill_process sends nothing else).
                let how = format!("{message}; its memory cgroup's oom_kill count moved");
                let call = Call {
                    killed: killed(libc::SIGKILL, how)?,
                    ..Call::ok(0)
                };
                return Ok((0, call));
            }
            Err(e) => return Err(failed(stmt, e)),
        };
        p.minflt += reply.loop_faults;
        let mut call = Call {
            faults: reply.all_faults,
            own_faults: (reply.all_faults - reply.loop_faults).max(0),
            errno: reply.errno,
            killed: None,
        };
        if reply.signal != 0 {
            // The fault that failed is counted in pgfault but not in the
            // agent's own faults (mm_account_fault counts a VM_FAULT_ERROR
            // fault in PGFAULT only).
            if reply.signal == libc::SIGBUS {
                call.faults += 1;
            }
            let how = match reply.signal {
                libc::SIGSEGV => format!(
                    "its access at {:#x} is to memory unmapped, or not with that permission",
                    reply.value
                ),
                _ => format!("its access at {:#x} could not be served", reply.value),
            };
            call.killed = killed(reply.signal, how)?;
        }
        let dir = p.memcg_dir.clone();
        if call.killed.is_none() && oom_killed(p, oom_kills_before) {
            // The OOM killer chose another process of the group.
            call.killed = self.oom_victim(proc, dir.as_deref());
        }
        Ok((reply.value, call))
    }

    /// Sends `req` to the agent of `proc`: the call (the value is unused).
    pub(crate) fn call(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        req: Request,
    ) -> Result<Call, BackendError> {
        Ok(self.request(stmt, proc, req)?.1)
    }

    /// The start and length of `r` in `proc`'s address space.
    pub(crate) fn range(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        r: &Range,
    ) -> Result<(u64, u64), BackendError> {
        let p = self.get_mut(stmt, proc)?;
        let region = p.regions.get(&r.region).ok_or_else(|| {
            failed(
                stmt,
                format!("unknown region '{}' of process '{proc}'", r.region),
            )
        })?;
        let (lo, hi) = r
            .resolve(region.start, region.len)
            .map_err(|e| failed(stmt, e))?;
        Ok((lo, hi - lo))
    }

    /// Why some live agent's page tables are shared with the agent's own
    /// (see [`Proc::shared_tables`]), if one's are.
    pub(crate) fn shared_tables(&self) -> Option<&String> {
        self.procs.values().find_map(|p| p.shared_tables.as_ref())
    }

    /// Whether a live agent is in a memory cgroup of the workload's, whose
    /// limit may make its statements reclaim.
    pub(crate) fn in_memcg(&self) -> bool {
        self.procs.values().any(|p| p.workload_memcg)
    }

    /// The live agents' pids, sorted.
    pub(crate) fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.procs.values().map(|p| p.agent.pid).collect();
        pids.sort_unstable();
        pids
    }
}

impl Proc {
    /// The channel of task `name` of this process: its thread's, or its
    /// first task's.
    pub(crate) fn channel(&mut self, name: &str) -> &mut AgentProc {
        match self.threads.get_mut(name) {
            Some(thread) => thread,
            None => &mut self.agent,
        }
    }

    /// Each region's name, start and length.
    pub(crate) fn spans(&self) -> impl Iterator<Item = (&String, (u64, u64))> {
        self.regions.iter().map(|(n, r)| (n, (r.start, r.len)))
    }
}
