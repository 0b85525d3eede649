//! `KernelBackend`: the workload's statements on the real kernel, each run
//! by a process agent ([`crate::process`]) inside a measurement window
//! ([`crate::measure`]); khugepaged is handled in [`crate::khugepaged`].
//!
//! The backend owns its parts and wires them: the settings guard, the
//! workload's processes ([`Agents`]) and memory cgroups, the
//! [`Measurement`] (windows, totals, what is trusted) and the
//! [`KhugepagedHold`] (the sentinel and the held scan sleep).

use crate::error::{errno_name, KernelError};
use crate::guard::SettingsGuard;
use crate::khugepaged::{pmd_enabled, KhugepagedHold};
use crate::measure::{
    rcu_settle, read_process, read_region, settle_dead_mms, zeroed_process, Measurement,
};
use crate::memcg::Memcg;
use crate::process::AgentProc;
use crate::protocol::{Access, Request};
use crate::sysfs;
use hugelab_workload::gone::Gone;
use hugelab_workload::mapped::Mapped;
use hugelab_workload::units::PAGE_SIZE;
use hugelab_workload::{
    placement, stmt, Advice, Backend, BackendError, BackendErrorKind, Errno, HugetlbSize,
    KhugepagedKnob, Lookahead, MachineParam, Prot, Range, Reading, Signal, Stmt, StmtKind, Tunable,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const BACKEND: &str = "kernel";
const MADV_COLLAPSE: i32 = 25;

/// One of the workload's regions: where it is and what of it is still mapped.
#[derive(Clone)]
struct Region {
    start: u64,
    len: u64,
    mapped: Mapped,
}

/// One of the workload's processes: its agent and its regions.
struct Proc {
    agent: AgentProc,
    /// The regions that exist (a region fully unmapped is gone).
    regions: BTreeMap<String, Region>,
    /// Where the next region goes (`placement::place_region`).
    cursor: u64,
    /// Faults taken by the workload's accesses (getrusage around the loop).
    minflt: i64,
    /// The directory of the memory cgroup the agent is in, if the workload
    /// put it in one (a forked agent is in its parent's).
    memcg_dir: Option<std::path::PathBuf>,
}

/// The workload's processes by name, each a live agent: what a window's
/// statement runs against.
pub(crate) struct Agents {
    procs: BTreeMap<String, Proc>,
}

/// One of the workload's processes as it runs on the kernel.
pub struct LiveProcess {
    pub name: String,
    pub pid: i32,
    /// Each region's start address and length.
    pub regions: BTreeMap<String, (u64, u64)>,
}

pub struct KernelBackend {
    exe: PathBuf,
    guard: SettingsGuard,
    agents: Agents,
    measure: Measurement,
    khugepaged: KhugepagedHold,
    cgroups: BTreeMap<String, Memcg>,
}

/// What one statement's system call did inside a window: the faults the
/// agents took, its errno (0: it succeeded), and the process the kernel
/// killed during it, if one.
pub(crate) struct Call {
    pub(crate) faults: i64,
    pub(crate) errno: Errno,
    pub(crate) killed: Option<Killed>,
}

/// A process killed by a signal during a statement: gone when the window
/// closes, its memory freed inside it.
pub(crate) struct Killed {
    pub(crate) proc: String,
    pub(crate) signal: Signal,
    /// How, for people.
    pub(crate) message: String,
}

impl Call {
    pub(crate) fn ok(faults: i64) -> Call {
        Call {
            faults,
            errno: Errno::OK,
            killed: None,
        }
    }
}

pub(crate) fn failed(stmt: &Stmt, e: impl std::fmt::Display) -> BackendError {
    BackendError::failed(stmt.pos, e.to_string())
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

    fn get_mut(&mut self, stmt: &Stmt, name: &str) -> Result<&mut Proc, BackendError> {
        self.procs
            .get_mut(name)
            .ok_or_else(|| failed(stmt, format!("no process '{name}'")))
    }

    /// Sends `req` to the agent of `proc`: the value it returned, and the
    /// call. An agent killed by SIGBUS or SIGKILL is a call that killed
    /// `proc` (a workload outcome); by SIGSEGV, an access the workload
    /// should not make, it stops the run, as on the model.
    fn request(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        req: Request,
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
        let reply = match p.agent.request(req) {
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
    fn call(&mut self, stmt: &Stmt, proc: &str, req: Request) -> Result<Call, BackendError> {
        Ok(self.request(stmt, proc, req)?.1)
    }

    /// The start and length of `r` in `proc`'s address space.
    fn range(&mut self, stmt: &Stmt, proc: &str, r: &Range) -> Result<(u64, u64), BackendError> {
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

    /// The live agents' pids, sorted.
    pub(crate) fn pids(&self) -> Vec<i32> {
        let mut pids: Vec<i32> = self.procs.values().map(|p| p.agent.pid).collect();
        pids.sort_unstable();
        pids
    }

    /// Every process's own counters (see [`read_process`]).
    fn read(
        &self,
        c: &mut hugelab_workload::Counters,
        unknown: &mut BTreeMap<String, String>,
    ) -> Result<(), KernelError> {
        for (name, p) in &self.procs {
            read_process(name, p.agent.pid, p.minflt, p.spans(), c, unknown)?;
        }
        Ok(())
    }
}

impl Proc {
    /// Each region's name, start and length.
    fn spans(&self) -> impl Iterator<Item = (&String, (u64, u64))> {
        self.regions.iter().map(|(n, r)| (n, (r.start, r.len)))
    }
}

impl KernelBackend {
    /// Takes the settings lock, quiets khugepaged and starts the sentinel.
    /// `exe` is the `hugelab` binary, run as `hugelab __agent` for each process.
    pub fn new(exe: PathBuf) -> Result<KernelBackend, KernelError> {
        crate::agent::hold_runner_memory();
        let mut guard = SettingsGuard::acquire()?;
        crate::guard::set_cleanup_hook(crate::process::kill_all);
        let khugepaged = KhugepagedHold::start(&exe, &mut guard)?;
        let mut backend = KernelBackend {
            exe,
            guard,
            agents: Agents {
                procs: BTreeMap::new(),
            },
            measure: Measurement::new(),
            khugepaged,
            cgroups: BTreeMap::new(),
        };
        crate::agent::prefault_runner();
        // Page tables of processes that exited just before (an earlier run's
        // agents) must leave the counters before the first window.
        settle_dead_mms();
        backend.measure.warm_up()?;
        // The scan_sleep write above woke khugepaged for one pass, and the
        // guard's signal thread takes its first faults when it first runs:
        // both must be over before the first window.
        std::thread::sleep(Duration::from_millis(50));
        Ok(backend)
    }

    /// The workload's live processes: what `hugelab utilization --backend
    /// kernel` scans between statements.
    pub fn processes(&self) -> Vec<LiveProcess> {
        self.agents
            .procs
            .iter()
            .map(|(name, p)| LiveProcess {
                name: name.clone(),
                pid: p.agent.pid,
                regions: p.spans().map(|(n, span)| (n.clone(), span)).collect(),
            })
            .collect()
    }

    /// Restores every tunable now (also done on drop).
    pub fn finish(mut self) -> Result<(), KernelError> {
        self.release();
        self.guard.restore()
    }

    /// Ends the agents, the sentinel and the cgroups: agents first, so that
    /// hugetlb pages are free before pools shrink.
    fn release(&mut self) {
        self.agents.procs.clear();
        self.khugepaged.stop();
        self.cgroups.clear();
    }

    /// Runs `f` against the agents inside a measurement window.
    fn window(
        &mut self,
        stmt: &Stmt,
        collapse_allowed: bool,
        f: impl FnOnce(&mut Agents) -> Result<Call, BackendError>,
    ) -> Result<(), BackendError> {
        self.measure
            .window(stmt, collapse_allowed, &mut self.agents, f)
    }

    fn set(&mut self, stmt: &Stmt, tunable: &Tunable, value: String) -> Result<(), BackendError> {
        let pmd_before = pmd_enabled();
        if *tunable == Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs) {
            // The workload's own choice: khugepaged may then run on its own,
            // which the windows detect.
            self.khugepaged.set_scan_sleep(&value);
        }
        self.guard.journal(tunable).map_err(|e| failed(stmt, e))?;
        let guard = &mut self.guard;
        self.measure.window(stmt, false, &mut self.agents, |_| {
            guard.set(tunable, &value).map_err(|e| failed(stmt, e))?;
            Ok(Call::ok(0))
        })?;
        if !pmd_before && pmd_enabled() {
            // khugepaged just started and scans at once: let that pass end.
            self.khugepaged.register().map_err(|e| failed(stmt, e))?;
            std::thread::sleep(Duration::from_millis(100));
        }
        gigantic_pool_filled(stmt, tunable, &value)
    }

    /// The `khugepaged` statement: returns at once when the PMD size is
    /// disabled (the thread is not running: nothing collapses).
    fn run_khugepaged(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        if !pmd_enabled() {
            return Ok(());
        }
        self.khugepaged.register().map_err(|e| failed(stmt, e))?;
        let (hold, guard) = (&self.khugepaged, &mut self.guard);
        self.measure
            .window(stmt, true, &mut self.agents, |_| hold.scan(stmt, guard))
    }

    /// After a munmap of `[start, start + len)` in `region` of `proc`: once
    /// nothing of the region is mapped, it is gone (its name is free again)
    /// and its counters as of now go to `gone`.
    fn retire_region_if_unmapped(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        region: &str,
        start: u64,
        len: u64,
        gone: &mut Gone,
    ) -> Result<(), BackendError> {
        let p = self.agents.get_mut(stmt, proc)?;
        let Some(r) = p.regions.get_mut(region) else {
            return Ok(());
        };
        r.mapped.unmap(start - r.start, start - r.start + len);
        if !r.mapped.is_empty() {
            return Ok(());
        }
        let (mut c, mut unknown) = (Default::default(), BTreeMap::new());
        let (pid, r_start, r_len) = (p.agent.pid, r.start, r.len);
        read_region(proc, pid, region, r_start, r_len, &mut c, &mut unknown)
            .map_err(|e| failed(stmt, e))?;
        p.regions.remove(region);
        gone.add(self.measure.judge(c, unknown));
        Ok(())
    }

    fn check_machine(&self, stmt: &Stmt, params: &[MachineParam]) -> Result<(), BackendError> {
        for p in params {
            let ok = match p {
                MachineParam::Arch(a) => {
                    format!("{a:?}").to_lowercase() == std::env::consts::ARCH.replace('-', "_")
                }
                // SAFETY: sysconf has no preconditions.
                MachineParam::BasePage(s) => {
                    s.bytes() == unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as u64
                }
                MachineParam::Memory(_) => false,
                // The rule and struct page of Linux 6.18 on x86_64.
                MachineParam::Hvo(r) => *r == hugelab_workload::HvoRuleName::Linux618,
                MachineParam::StructPage(n) => *n == 64,
            };
            if !ok {
                return Err(BackendError {
                    pos: stmt.pos,
                    kind: hugelab_workload::BackendErrorKind::Unsupported,
                    message: format!(
                        "this machine does not have the shape `{}` asks for; the kernel backend runs only on the machine it is on",
                        stmt.kind
                    ),
                });
            }
        }
        Ok(())
    }
}

impl KernelBackend {
    /// One statement (see [`Backend::execute_retiring`]).
    fn execute_stmt(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        match &stmt.kind {
            StmtKind::Set(stmt::Set { tunable, value }) => self.set(stmt, tunable, value.to_string())?,
            StmtKind::Machine(stmt::Machine { params }) => self.check_machine(stmt, params)?,
            StmtKind::Cgroup(stmt::Cgroup { cgroup, memory_max }) => {
                let cg = Memcg::create(cgroup, memory_max.map(|m| m.bytes()))
                    .map_err(|e| failed(stmt, e))?;
                self.cgroups.insert(cgroup.clone(), cg);
            }
            StmtKind::Spawn(stmt::Spawn { proc, cgroup }) => {
                let agent = AgentProc::spawn(&self.exe).map_err(|e| failed(stmt, e))?;
                // The agent re-executed itself: the page tables of its first
                // image are freed later (lazy TLB mm, RCU callbacks), which
                // must not land in the next window.
                settle_dead_mms();
                let mut memcg_dir = None;
                if let Some(cg) = cgroup {
                    let memcg = self
                        .cgroups
                        .get_mut(cg)
                        .ok_or_else(|| failed(stmt, format!("no cgroup '{cg}'")))?;
                    memcg.attach(agent.pid).map_err(|e| failed(stmt, e))?;
                    memcg_dir = Some(memcg.dir().to_path_buf());
                }
                self.agents.procs.insert(
                    proc.clone(),
                    Proc {
                        agent,
                        regions: BTreeMap::new(),
                        cursor: 0,
                        minflt: 0,
                        memcg_dir,
                    },
                );
            }
            StmtKind::Mmap(stmt::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                shared,
                prot,
            }) => {
                let len = size.bytes().next_multiple_of(PAGE_SIZE);
                let align = match (align, hugetlb) {
                    (Some(a), _) => a.bytes().max(PAGE_SIZE),
                    (None, Some(HugetlbSize::Size1G)) => 1 << 30,
                    (None, _) => placement::default_align(len),
                };
                let p = self.agents.get_mut(stmt, proc)?;
                let mut cursor = p.cursor;
                let start = placement::place_region(&mut cursor, len, align);
                let req = Request::Mmap {
                    addr: start,
                    len,
                    prot: prot_bits(prot.unwrap_or(Prot::ReadWrite)),
                    shared: *shared,
                    hugetlb: *hugetlb,
                };
                let mut addr = 0;
                self.window(stmt, false, |agents| {
                    let (a, faults) = agents.request(stmt, proc, req)?;
                    addr = a as u64;
                    Ok(faults)
                })?;
                let p = self.agents.get_mut(stmt, proc)?;
                p.regions.insert(
                    region.clone(),
                    Region {
                        start: addr,
                        len,
                        mapped: Mapped::whole(len),
                    },
                );
                p.cursor = cursor;
                // THP eligibility depends on VMA bounds: the region must be
                // one VMA of its own, merged with nothing.
                let vmas = crate::smaps::region_smaps(p.agent.pid, addr, addr + len)
                    .map_err(|e| failed(stmt, e))?
                    .vmas;
                if vmas != 1 {
                    return Err(failed(
                        stmt,
                        format!("region '{region}' is {vmas} VMAs in the kernel, not one"),
                    ));
                }
            }
            StmtKind::Munmap(stmt::Munmap { proc, range }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let req = Request::Munmap { addr: start, len };
                self.window(stmt, false, |agents| agents.call(stmt, proc, req))?;
                self.retire_region_if_unmapped(stmt, proc, &range.region, start, len, gone)?;
            }
            StmtKind::Mprotect(stmt::Mprotect { proc, range, prot }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let req = Request::Mprotect {
                    addr: start,
                    len,
                    prot: prot_bits(*prot),
                };
                self.window(stmt, false, |agents| agents.call(stmt, proc, req))?;
            }
            StmtKind::Madvise(stmt::Madvise {
                proc,
                range,
                advice,
            }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let req = Request::Madvise {
                    addr: start,
                    len,
                    advice: advice_bits(*advice),
                };
                let collapse = *advice == Advice::Collapse;
                self.window(stmt, collapse, |agents| agents.call(stmt, proc, req))?;
            }
            StmtKind::Read(stmt::Read { proc, range, step })
            | StmtKind::Write(stmt::Write {
                proc, range, step, ..
            }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                let access = match &stmt.kind {
                    StmtKind::Write(stmt::Write { zero: true, .. }) => Access::WriteZero,
                    StmtKind::Write { .. } => Access::Write,
                    _ => Access::Read,
                };
                let req = Request::Touch {
                    addr: start,
                    len,
                    step,
                    access,
                };
                self.window(stmt, false, |agents| agents.call(stmt, proc, req))?;
            }
            StmtKind::Fork(stmt::Fork { proc, child }) => {
                let mut forked = None;
                self.window(stmt, false, |agents| {
                    let p = agents.get_mut(stmt, proc)?;
                    let (agent, reply) = p.agent.fork().map_err(|e| failed(stmt, e))?;
                    let faults = reply.all_faults + agent.hello_faults;
                    forked = Some(Proc {
                        agent,
                        regions: p.regions.clone(),
                        cursor: p.cursor,
                        minflt: 0,
                        memcg_dir: p.memcg_dir.clone(),
                    });
                    Ok(Call::ok(faults))
                })?;
                if let Some(p) = forked {
                    self.agents.procs.insert(child.clone(), p);
                }
            }
            StmtKind::ThpDisable(stmt::ThpDisable { proc, on }) => {
                let req = Request::ThpDisable { on: *on };
                self.window(stmt, false, |agents| agents.call(stmt, proc, req))?;
            }
            StmtKind::Exit(stmt::Exit { proc }) => {
                // The regions go inside the window, as exit_mmap would take
                // them; the agent's own memory goes outside it.
                let regions: Vec<(u64, u64)> = self
                    .agents
                    .get_mut(stmt, proc)?
                    .spans()
                    .map(|(_, span)| span)
                    .collect();
                self.window(stmt, false, |agents| {
                    let mut all = Call::ok(0);
                    for (start, len) in regions {
                        let call = agents.call(stmt, proc, Request::Munmap { addr: start, len })?;
                        all.faults += call.faults;
                        if call.errno != Errno::OK {
                            return Err(failed(
                                stmt,
                                format!("munmap at exit failed: {}", call.errno),
                            ));
                        }
                    }
                    Ok(all)
                })?;
                if let Some(p) = self.agents.procs.remove(proc) {
                    // What it leaves: its counters with nothing mapped.
                    let (mut c, mut unknown) = (Default::default(), BTreeMap::new());
                    read_process(proc, p.agent.pid, p.minflt, p.spans(), &mut c, &mut unknown)
                        .map_err(|e| failed(stmt, e))?;
                    gone.add(self.measure.judge(c, unknown));
                    p.agent.exit().map_err(|e| failed(stmt, e))?;
                    settle_dead_mms(); // its own page tables, as after spawn
                }
            }
            StmtKind::Split(stmt::Split { proc, range }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let pid = self.agents.get_mut(stmt, proc)?.agent.pid;
                self.window(stmt, false, |_| {
                    split_huge_pages(pid, start, start + len).map_err(|e| failed(stmt, e))?;
                    Ok(Call::ok(0))
                })?;
            }
            StmtKind::Pin(stmt::Pin { proc, range }) | StmtKind::Unpin(stmt::Unpin { proc, range }) => {
                let (start, len) = self.agents.range(stmt, proc, range)?;
                let req = match stmt.kind {
                    StmtKind::Pin { .. } => Request::Pin { addr: start, len },
                    _ => Request::Unpin { addr: start, len },
                };
                self.window(stmt, false, |agents| agents.call(stmt, proc, req))?;
            }
            StmtKind::Khugepaged => self.run_khugepaged(stmt)?,
            StmtKind::Fragment { .. } => {
                return Err(BackendError {
                    pos: stmt.pos,
                    kind: hugelab_workload::BackendErrorKind::Unsupported,
                    message: "fragment is model-only: the kernel's memory cannot be fragmented on demand on these machines (the generator places unmovable kernel pages at chosen physical frames, which no user-space call can do)".into(),
                })
            }
            StmtKind::Reclaim => {
                // drop_caches=2 runs the slab shrinkers, the deferred split
                // shrinker (with its under-used check) among them.
                self.window(stmt, false, |_| {
                    drop_slab().map_err(|e| failed(stmt, e))?;
                    Ok(Call::ok(0))
                })?;
            }
            StmtKind::Snapshot { .. }
            | StmtKind::Expect { .. }
            | StmtKind::ExpectErrno { .. }
            | StmtKind::ExpectSignal { .. } => {}
        }
        Ok(())
    }

    /// After `proc` was killed during `stmt`: it is gone as after `exit`,
    /// its counters with nothing mapped going to `gone` (its memory was
    /// freed when it died).
    fn retire_killed(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        gone: &mut Gone,
    ) -> Result<(), BackendError> {
        let Some(p) = self.agents.procs.remove(proc) else {
            return Err(failed(stmt, format!("no process '{proc}' to retire")));
        };
        let mut c = Default::default();
        zeroed_process(proc, p.minflt, p.spans(), &mut c);
        gone.add(self.measure.judge(c, BTreeMap::new()));
        drop(p);
        settle_dead_mms(); // its mm's last page tables, as after exit
        Ok(())
    }
}

/// After `set` of a 1 GiB pool's nr_hugepages: the kernel allocates each
/// gigantic page from contiguous memory (alloc_contig_pages), which a
/// fragmented machine may not have, and gives fewer than asked without an
/// error. Whether it can is the machine's state, not the workload's: then
/// the workload cannot run here now (2 MiB pools are left as they are).
fn gigantic_pool_filled(stmt: &Stmt, tunable: &Tunable, value: &str) -> Result<(), BackendError> {
    const GIGANTIC_KB: u64 = 1 << 20;
    if *tunable
        != (Tunable::HugetlbNrHugepages {
            size_kb: GIGANTIC_KB,
        })
    {
        return Ok(());
    }
    let asked: u64 = value.parse().map_err(|_| {
        failed(
            stmt,
            format!("{value:?} is not a number of pages for {}", tunable.path()),
        )
    })?;
    let got = sysfs::read_tunable(tunable).map_err(|e| failed(stmt, e))?;
    let got: u64 = got.parse().map_err(|_| {
        failed(
            stmt,
            format!(
                "{} reads {got:?}, not a number",
                sysfs::tunable_file(tunable).display()
            ),
        )
    })?;
    if got < asked {
        return Err(BackendError::unavailable(
            stmt,
            format!(
                "the kernel gave {got} of {asked} 1 GiB pages (it found no more free contiguous 1 GiB ranges)"
            ),
        ));
    }
    Ok(())
}

/// Writes `<pid>,0x<start>,0x<end>` to debugfs split_huge_pages, which splits
/// every THP mapped in the range. Kernels in lockdown (these VMs) refuse
/// debugfs writes even to root: then one sentence says so.
fn split_huge_pages(pid: i32, start: u64, end: u64) -> Result<(), KernelError> {
    const FILE: &str = "/sys/kernel/debug/split_huge_pages";
    let line = format!("{pid},{start:#x},{end:#x}");
    std::fs::write(FILE, line).map_err(|e| match e.raw_os_error() {
        Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::ENOENT) => KernelError::Refused(format!(
            "split needs {FILE}, which this kernel refuses ({}: debugfs locked down or not mounted); split by a partial munmap and `reclaim` instead",
            errno_name(e.raw_os_error().unwrap_or(0))
        )),
        _ => KernelError::io(FILE, e),
    })
}

/// `echo 2 > /proc/sys/vm/drop_caches`: the slab shrinkers, the deferred
/// split shrinker (with its under-used check) among them.
fn drop_slab() -> Result<(), KernelError> {
    let path = std::path::Path::new(sysfs::PROC_VM).join("drop_caches");
    sysfs::write_value(&path, "2")
}

/// Sends `req` outside any window: its value, or an error if it failed.
pub(crate) fn req_ok(agent: &mut AgentProc, req: Request) -> Result<i64, KernelError> {
    let reply = agent.request(req)?;
    if reply.errno != Errno::OK {
        return Err(KernelError::Agent(format!(
            "agent request {req:?} failed: {}",
            errno_name(reply.errno.0)
        )));
    }
    Ok(reply.value)
}

fn prot_bits(p: Prot) -> i32 {
    match p {
        Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        Prot::Read => libc::PROT_READ,
        Prot::None => libc::PROT_NONE,
    }
}

fn advice_bits(a: Advice) -> i32 {
    match a {
        Advice::Hugepage => libc::MADV_HUGEPAGE,
        Advice::NoHugepage => libc::MADV_NOHUGEPAGE,
        Advice::DontNeed => libc::MADV_DONTNEED,
        Advice::Free => libc::MADV_FREE,
        Advice::Collapse => MADV_COLLAPSE,
        Advice::Pageout => libc::MADV_PAGEOUT,
        Advice::Cold => libc::MADV_COLD,
    }
}

impl Backend for KernelBackend {
    fn name(&self) -> &str {
        BACKEND
    }

    /// A workload that reclaims would also split the folios other processes
    /// left on the deferred split queue (counted system-wide as if they were
    /// its own): empty the queue once before the first statement.
    fn prepare(&mut self, ahead: &Lookahead) -> Result<(), BackendError> {
        if ahead.reclaims {
            drop_slab().map_err(|e| BackendError::failed(Default::default(), e.to_string()))?;
            rcu_settle();
        }
        Ok(())
    }

    /// `prepare` must know whether the workload reclaims.
    fn needs_lookahead(&self) -> bool {
        true
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        self.execute_retiring(stmt, &mut Gone::default())
    }

    fn execute_retiring(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let result = self.execute_stmt(stmt, gone);
        if let Err(BackendError {
            kind: BackendErrorKind::Killed { proc, .. },
            ..
        }) = &result
        {
            self.retire_killed(stmt, proc, gone)?;
        }
        result
    }

    /// Every counter as of now, and those of them that cannot be trusted
    /// (removed from the counters, with the reason in `unknown`).
    fn read(&mut self) -> Result<Reading, BackendError> {
        let err = |e: KernelError| BackendError::failed(Default::default(), e.to_string());
        let mut c = self.measure.system_counters();
        for cg in self.cgroups.values() {
            c.extend(cg.counters().map_err(err)?);
        }
        let mut unknown = BTreeMap::new();
        self.agents.read(&mut c, &mut unknown).map_err(err)?;
        Ok(self.measure.judge(c, unknown))
    }
}

impl Drop for KernelBackend {
    fn drop(&mut self) {
        // The guard restores the tunables when it drops after this.
        self.release();
    }
}
