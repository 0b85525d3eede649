//! `KernelBackend`: the workload's statements on the real kernel, each run
//! by a process agent ([`crate::process`]) inside a measurement window
//! ([`crate::measure`]).
//!
//! The backend owns its parts and wires them: the settings guard, the
//! workload's processes ([`Agents`]) and memory cgroups, the
//! [`Measurement`] (windows, totals, what is trusted) and the
//! [`KhugepagedHold`] (the sentinel and the held scan sleep).
//!
//! `execute_stmt` is a thin table from statement to its handler, which lives
//! in the module of its mechanism, as the kernel's `SYSCALL_DEFINE`s live in
//! mm/mmap.c, mm/madvise.c...: [`crate::mmap`] (mmap, munmap),
//! [`crate::mprotect`], [`crate::madvise`], [`crate::memory`] (read, write),
//! [`crate::gup`] (pin, unpin), [`crate::task`] (spawn, fork, exit,
//! thp_disable), [`crate::huge_memory`] (split), [`crate::khugepaged`],
//! [`crate::vmscan`] (reclaim), [`crate::tunable`] (set), [`crate::memcg`]
//! (cgroup) and [`crate::machine`] (machine, fragment). Handlers take only
//! the parts they use, so none of them depends on this module.

use crate::agents::Agents;
use crate::census::Census;
use crate::error::KernelError;
use crate::guard::SettingsGuard;
use crate::khugepaged::KhugepagedHold;
use crate::measure::{rcu_settle, read_process, settle_dead_mms, Measurement};
use crate::memcg::{Memcg, RunMemcg};
use crate::{gup, huge_memory, khugepaged, machine, madvise, memcg, memory, mmap, mprotect};
use crate::{task, tunable, vmscan};
use hugelab_workload::gone::Gone;
use hugelab_workload::{
    Backend, BackendError, BackendErrorKind, Lookahead, Reading, Stmt, StmtKind, Tunable,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const BACKEND: &str = "kernel";

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
    /// The run's own memory cgroup, the workload's groups inside it.
    run_memcg: Option<RunMemcg>,
}

/// The signal path's cleanup: the agents, then the run's memory cgroups.
fn cleanup() {
    crate::process::kill_all();
    crate::memcg::remove_own();
}

impl KernelBackend {
    /// Takes the settings lock, quiets khugepaged and starts the sentinel.
    /// `exe` is the `hugelab` binary, run as `hugelab __agent` for each process.
    /// The agents run in a memory cgroup limited to what MemAvailable
    /// allows ([`crate::memcg::default_limit`]): the caller knows no bound.
    pub fn new(exe: PathBuf) -> Result<KernelBackend, KernelError> {
        let limit = crate::memcg::default_limit()?;
        KernelBackend::with_memory_limit(exe, limit)
    }

    /// [`KernelBackend::new`] with the agents' memory cgroup limited to
    /// `limit` bytes (`hugelab_workload::bound` and its margin).
    pub fn with_memory_limit(exe: PathBuf, limit: u64) -> Result<KernelBackend, KernelError> {
        crate::agent::hold_runner_memory();
        let mut guard = SettingsGuard::acquire()?;
        crate::guard::set_cleanup_hook(cleanup);
        let run_memcg = Some(RunMemcg::create(limit)?);
        let khugepaged = KhugepagedHold::start(&exe, &mut guard)?;
        let mut backend = KernelBackend {
            exe,
            guard,
            agents: Agents::default(),
            measure: Measurement::new(),
            khugepaged,
            cgroups: BTreeMap::new(),
            run_memcg,
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

    /// `t`'s value as this run found it, before its guard changed anything
    /// (the khugepaged hold, a `set`): what a model must start from to run
    /// beside it. Read under the settings lock, so never another run's value.
    pub fn found_tunable(&self, t: &Tunable) -> Result<String, KernelError> {
        let path = t.path();
        match self
            .guard
            .journaled()
            .into_iter()
            .find(|(name, _)| *name == path)
        {
            Some((_, old)) => Ok(old),
            None => crate::sysfs::read_tunable(t),
        }
    }

    /// Restores every tunable now (also done on drop).
    pub fn finish(mut self) -> Result<(), KernelError> {
        self.release();
        self.guard.restore()
    }

    /// Ends the agents, the sentinel and the cgroups: agents first, so that
    /// hugetlb pages are free before pools shrink.
    fn release(&mut self) {
        self.agents.thread_of.clear();
        self.agents.procs.clear();
        self.khugepaged.stop();
        self.cgroups.clear();
        self.run_memcg = None;
    }

    /// The run's memory cgroup and its limit in bytes.
    pub fn memory_cgroup(&self) -> Option<(&std::path::Path, u64)> {
        self.run_memcg.as_ref().map(|m| (m.dir(), m.limit()))
    }
}

impl KernelBackend {
    /// One statement (see [`Backend::execute_retiring`]): a table from
    /// statement to its handler.
    fn execute_stmt(&mut self, stmt: &Stmt, gone: &mut Gone) -> Result<(), BackendError> {
        let (m, a) = (&mut self.measure, &mut self.agents);
        if !matches!(stmt.kind, StmtKind::Read(_) | StmtKind::Write(_)) {
            // Only a read or write may start from the reading the window
            // before it ended with (see `measure::Chain`).
            m.unchain();
        }
        match &stmt.kind {
            StmtKind::Set(s) => tunable::set(&mut self.guard, &mut self.khugepaged, m, a, stmt, s),
            StmtKind::Machine(s) => machine::machine(stmt, s),
            StmtKind::Cgroup(s) => {
                memcg::cgroup(&mut self.cgroups, self.run_memcg.as_ref(), stmt, s)
            }
            StmtKind::Spawn(s) => task::spawn(
                &self.exe,
                &mut self.cgroups,
                self.run_memcg.as_mut(),
                a,
                stmt,
                s,
            ),
            StmtKind::Mmap(s) => mmap::mmap(m, a, stmt, s),
            StmtKind::Brk(s) => mmap::brk(m, a, stmt, s),
            StmtKind::Munmap(s) => mmap::munmap(m, a, stmt, s, gone),
            StmtKind::Mprotect(s) => mprotect::mprotect(m, a, stmt, s),
            StmtKind::Mremap(s) => crate::mremap::mremap(m, a, stmt, s),
            StmtKind::Madvise(s) => madvise::madvise(m, a, stmt, s),
            StmtKind::Read(s) => memory::read(m, a, stmt, s),
            StmtKind::Special(s) => memory::special(m, a, stmt, s),
            StmtKind::Write(s) => memory::write(m, a, stmt, s),
            StmtKind::Pin(s) => gup::pin(m, a, stmt, s),
            StmtKind::Unpin(s) => gup::unpin(m, a, stmt, s),
            StmtKind::Fork(s) => task::fork(m, a, stmt, s),
            StmtKind::ThpDisable(s) => task::thp_disable(m, a, stmt, s),
            StmtKind::Thread(s) => task::thread(a, stmt, s),
            StmtKind::Exit(s) => task::exit(m, a, stmt, s, gone),
            StmtKind::Exec(s) => task::exec(
                m,
                a,
                &mut self.cgroups,
                self.run_memcg.as_mut(),
                stmt,
                s,
                gone,
            ),
            StmtKind::Split(s) => huge_memory::split(m, a, stmt, s),
            StmtKind::Khugepaged => {
                khugepaged::khugepaged(&mut self.khugepaged, &mut self.guard, m, a, stmt)
            }
            StmtKind::Reclaim => vmscan::reclaim(m, a, stmt),
            // Time passes, and khugepaged makes the passes due in it.
            StmtKind::Sleep(s) => self.khugepaged.sleep(&mut self.guard, m, a, stmt, s.ns),
            StmtKind::Fragment(_) => machine::fragment(stmt),
            StmtKind::Snapshot(_)
            | StmtKind::Expect(_)
            | StmtKind::ExpectErrno(_)
            | StmtKind::ExpectSignal(_) => Ok(()),
        }
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
            vmscan::drop_slab()
                .map_err(|e| BackendError::failed(Default::default(), e.to_string()))?;
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
            task::retire_killed(&self.measure, &mut self.agents, stmt, proc, gone)?;
        }
        result
    }

    /// Every counter as of now, and those of them that cannot be trusted
    /// (removed from the counters, with the reason in `unknown`).
    fn mark(&mut self) -> bool {
        self.measure.mark();
        true
    }

    fn read(&mut self) -> Result<Reading, BackendError> {
        let err = |e: KernelError| BackendError::failed(Default::default(), e.to_string());
        self.measure.unchain();
        let mut c = self.measure.system_counters();
        for cg in self.cgroups.values() {
            c.extend(cg.counters().map_err(err)?);
        }
        let mut unknown = BTreeMap::new();
        for (name, p) in &self.agents.procs {
            read_process(name, p.agent.pid, p.minflt, p.spans(), &mut c, &mut unknown)
                .map_err(err)?;
            if let Some(why) = &p.minflt_unknown {
                unknown.insert(format!("stat.{name}.minflt"), why.clone());
            }
        }
        let census = Census::of(&self.agents, self.measure.ever_pinned());
        Ok(self.measure.judge_counted(c, unknown, &census))
    }
}

impl Drop for KernelBackend {
    fn drop(&mut self) {
        // The guard restores the tunables when it drops after this.
        self.release();
    }
}
