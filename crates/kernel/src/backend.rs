//! `KernelBackend`: the workload's statements on the real kernel, each run
//! by a process agent ([`crate::process`]) inside a measurement window
//! ([`crate::measure`]); khugepaged is handled in [`crate::khugepaged`].

use crate::agent::{map, op, touch, Request, REQUEST_WORDS};
use crate::error::{errno_name, KernelError};
use crate::guard::SettingsGuard;
use crate::khugepaged::{pmd_enabled, SCAN_SLEEP_HOLD};
use crate::measure::rcu_settle;
use crate::memcg::Memcg;
use crate::process::AgentProc;
use crate::sysfs;
use crate::vmstat::SystemReader;
use hugelab_workload::{
    placement, Advice, Backend, BackendError, Counters, HugetlbSize, KhugepagedKnob, MachineParam,
    Prot, Range, Stmt, StmtKind, Tunable, Workload,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

const BACKEND: &str = "kernel";
pub(crate) const PAGE_SIZE: u64 = 4096;
pub(crate) const PMD_SIZE: u64 = 2 << 20;
const MADV_COLLAPSE: i32 = 25;

pub(crate) struct Proc {
    pub(crate) agent: AgentProc,
    pub(crate) regions: BTreeMap<String, (u64, u64)>,
    /// Where the next region goes (`placement::place_region`).
    pub(crate) cursor: u64,
    /// Faults taken by the workload's accesses (getrusage around the loop).
    pub(crate) minflt: i64,
}

pub struct KernelBackend {
    pub(crate) exe: PathBuf,
    pub(crate) guard: SettingsGuard,
    /// Two readers, so that the reading before a statement is parsed only
    /// after the reading after it.
    pub(crate) before: SystemReader,
    pub(crate) after: SystemReader,
    pub(crate) procs: BTreeMap<String, Proc>,
    pub(crate) sentinel: Option<(AgentProc, u64)>,
    /// Sum of the windows' changes, per system-wide counter.
    pub(crate) totals: Counters,
    /// Latest value of the counters reported as read.
    pub(crate) absolute: Counters,
    pub(crate) last: Option<Counters>,
    /// Reasons that made counters unknown, by scope.
    pub(crate) noise: Option<(String, bool)>,
    pub(crate) unstable: Option<String>,
    pub(crate) forked: Option<u32>,
    /// mTHP sizes enabled at some point of the workload (see `window`).
    pub(crate) mthp_sizes_used: std::collections::BTreeSet<u64>,
    /// The scan_sleep_millisecs khugepaged returns to after a `khugepaged`.
    pub(crate) scan_sleep: String,
    /// What [`KernelBackend::observe`] found unknown, for `unknown()`.
    pub(crate) pending_unknown: BTreeMap<String, String>,
    pub(crate) cgroups: BTreeMap<String, Memcg>,
}

pub(crate) fn failed(stmt: &Stmt, e: impl std::fmt::Display) -> BackendError {
    BackendError::failed(stmt.pos, e.to_string())
}

impl KernelBackend {
    /// Takes the settings lock, quiets khugepaged and starts the sentinel.
    /// `exe` is the `hugelab` binary, run as `hugelab __agent` for each process.
    pub fn new(exe: PathBuf) -> Result<KernelBackend, KernelError> {
        crate::agent::hold_runner_memory();
        let mut guard = SettingsGuard::acquire()?;
        crate::guard::set_cleanup_hook(crate::process::kill_all);
        guard.set(
            &Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs),
            SCAN_SLEEP_HOLD,
        )?;
        let mut backend = KernelBackend {
            exe,
            guard,
            before: SystemReader::new(),
            after: SystemReader::new(),
            procs: BTreeMap::new(),
            sentinel: None,
            totals: Counters::new(),
            absolute: Counters::new(),
            last: None,
            noise: None,
            unstable: None,
            forked: None,
            mthp_sizes_used: Default::default(),
            scan_sleep: SCAN_SLEEP_HOLD.to_string(),
            pending_unknown: BTreeMap::new(),
            cgroups: BTreeMap::new(),
        };
        backend.start_sentinel()?;
        crate::agent::prefault_runner();
        // Page tables of processes that exited just before (an earlier run's
        // agents) must leave the counters before the first window.
        rcu_settle();
        // One reading through each reader, so that the first window runs
        // warm code on warm buffers.
        for reader in [&mut backend.before, &mut backend.after] {
            reader.capture(true)?;
            reader.parse()?;
        }
        // The scan_sleep write above woke khugepaged for one pass, and the
        // guard's signal thread takes its first faults when it first runs:
        // both must be over before the first window.
        std::thread::sleep(Duration::from_millis(50));
        Ok(backend)
    }

    /// Restores every tunable now (also done on drop).
    pub fn finish(mut self) -> Result<(), KernelError> {
        self.procs.clear();
        self.sentinel = None;
        self.cgroups.clear();
        self.guard.restore()
    }

    fn proc_mut(&mut self, stmt: &Stmt, name: &str) -> Result<&mut Proc, BackendError> {
        self.procs
            .get_mut(name)
            .ok_or_else(|| failed(stmt, format!("no process '{name}'")))
    }

    fn request(
        &mut self,
        stmt: &Stmt,
        proc: &str,
        req: Request,
    ) -> Result<(i64, i64), BackendError> {
        let what = stmt.kind.keyword();
        let p = self.proc_mut(stmt, proc)?;
        let reply = p.agent.request(req).map_err(|e| failed(stmt, e))?;
        if reply[0] != 0 {
            return Err(failed(
                stmt,
                format!(
                    "{what} failed in the kernel: {}",
                    errno_name(reply[0] as i32)
                ),
            ));
        }
        p.minflt += reply[2];
        Ok((reply[1], reply[3]))
    }

    fn range(&mut self, stmt: &Stmt, proc: &str, r: &Range) -> Result<(u64, u64), BackendError> {
        let p = self.proc_mut(stmt, proc)?;
        let &(start, len) = p.regions.get(&r.region).ok_or_else(|| {
            failed(
                stmt,
                format!("unknown region '{}' of process '{proc}'", r.region),
            )
        })?;
        let (lo, hi) = r.resolve(start, len).map_err(|e| failed(stmt, e))?;
        Ok((lo, hi - lo))
    }

    fn set(&mut self, stmt: &Stmt, tunable: &Tunable, value: String) -> Result<(), BackendError> {
        let pmd_before = pmd_enabled();
        if *tunable == Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs) {
            // The workload's own choice: khugepaged may then run on its own,
            // which the windows detect.
            self.scan_sleep = value.clone();
        }
        self.guard.journal(tunable).map_err(|e| failed(stmt, e))?;
        self.window(stmt, false, |b| {
            b.guard.set(tunable, &value).map_err(|e| failed(stmt, e))?;
            Ok(0)
        })?;
        if !pmd_before && pmd_enabled() {
            // khugepaged just started and scans at once: let that pass end.
            self.register_sentinel().map_err(|e| failed(stmt, e))?;
            std::thread::sleep(Duration::from_millis(100));
        }
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
/// split and under-used THP shrinkers among them.
fn drop_slab() -> Result<(), KernelError> {
    let path = std::path::Path::new(sysfs::PROC_VM).join("drop_caches");
    sysfs::write_value(&path, "2")
}

pub(crate) fn req_ok(agent: &mut AgentProc, req: Request) -> Result<i64, KernelError> {
    let reply = agent.request(req)?;
    if reply[0] != 0 {
        return Err(KernelError::Agent(format!(
            "agent request {} failed: {}",
            req[0],
            errno_name(reply[0] as i32)
        )));
    }
    Ok(reply[1])
}

fn prot_bits(p: Prot) -> u64 {
    (match p {
        Prot::ReadWrite => libc::PROT_READ | libc::PROT_WRITE,
        Prot::Read => libc::PROT_READ,
        Prot::None => libc::PROT_NONE,
    }) as u64
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

pub(crate) fn request(words: &[u64]) -> Request {
    let mut r = [0u64; REQUEST_WORDS];
    r[..words.len()].copy_from_slice(words);
    r
}

impl Backend for KernelBackend {
    fn name(&self) -> &str {
        BACKEND
    }

    /// A workload that reclaims would also split the folios other processes
    /// left on the deferred split queue (counted system-wide as if they were
    /// its own): empty the queue once before the first statement.
    fn prepare(&mut self, workload: &Workload) -> Result<(), BackendError> {
        if workload.stmts.iter().any(|s| s.kind == StmtKind::Reclaim) {
            drop_slab().map_err(|e| BackendError::failed(Default::default(), e.to_string()))?;
            rcu_settle();
        }
        Ok(())
    }

    fn execute(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        match &stmt.kind {
            StmtKind::Set { tunable, value } => self.set(stmt, tunable, value.to_string())?,
            StmtKind::Machine { params } => self.check_machine(stmt, params)?,
            StmtKind::Cgroup { cgroup, memory_max } => {
                let cg = Memcg::create(cgroup, memory_max.map(|m| m.bytes()))
                    .map_err(|e| failed(stmt, e))?;
                self.cgroups.insert(cgroup.clone(), cg);
            }
            StmtKind::Spawn { proc, cgroup } => {
                let agent = AgentProc::spawn(&self.exe).map_err(|e| failed(stmt, e))?;
                // The agent re-executed itself: the page tables of its first
                // image are freed by RCU callbacks, which must not land in
                // the next window.
                rcu_settle();
                if let Some(cg) = cgroup {
                    let memcg = self
                        .cgroups
                        .get(cg)
                        .ok_or_else(|| failed(stmt, format!("no cgroup '{cg}'")))?;
                    memcg.attach(agent.pid).map_err(|e| failed(stmt, e))?;
                }
                self.procs.insert(
                    proc.clone(),
                    Proc {
                        agent,
                        regions: BTreeMap::new(),
                        cursor: 0,
                        minflt: 0,
                    },
                );
            }
            StmtKind::Mmap {
                proc,
                region,
                size,
                align,
                hugetlb,
                shared,
                prot,
            } => {
                let len = size.bytes().next_multiple_of(PAGE_SIZE);
                let align = match (align, hugetlb) {
                    (Some(a), _) => a.bytes().max(PAGE_SIZE),
                    (None, Some(HugetlbSize::Size1G)) => 1 << 30,
                    (None, _) => placement::default_align(len),
                };
                let p = self.proc_mut(stmt, proc)?;
                let mut cursor = p.cursor;
                let start = placement::place_region(&mut cursor, len, align);
                let mut flags = if *shared { map::SHARED } else { 0 };
                flags |= match hugetlb {
                    Some(HugetlbSize::Size2M) => map::HUGETLB_2M,
                    Some(HugetlbSize::Size1G) => map::HUGETLB_1G,
                    None => 0,
                };
                let prot = prot_bits(prot.unwrap_or(Prot::ReadWrite));
                let mut addr = 0;
                self.window(stmt, false, |b| {
                    let (a, faults) =
                        b.request(stmt, proc, request(&[op::MMAP, start, len, prot, flags]))?;
                    addr = a as u64;
                    Ok(faults)
                })?;
                let p = self.proc_mut(stmt, proc)?;
                p.regions.insert(region.clone(), (addr, len));
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
            StmtKind::Munmap { proc, range } => {
                let (start, len) = self.range(stmt, proc, range)?;
                self.window(stmt, false, |b| {
                    Ok(b.request(stmt, proc, request(&[op::MUNMAP, start, len]))?.1)
                })?;
            }
            StmtKind::Mprotect { proc, range, prot } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let prot = prot_bits(*prot);
                self.window(stmt, false, |b| {
                    Ok(
                        b.request(stmt, proc, request(&[op::MPROTECT, start, len, prot]))?
                            .1,
                    )
                })?;
            }
            StmtKind::Madvise {
                proc,
                range,
                advice,
            } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let bits = advice_bits(*advice) as u64;
                let collapse = *advice == Advice::Collapse;
                self.window(stmt, collapse, |b| {
                    Ok(
                        b.request(stmt, proc, request(&[op::MADVISE, start, len, bits]))?
                            .1,
                    )
                })?;
            }
            StmtKind::Read { proc, range, step }
            | StmtKind::Write {
                proc, range, step, ..
            } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                let flags = match &stmt.kind {
                    StmtKind::Write { zero: true, .. } => touch::WRITE | touch::ZERO,
                    StmtKind::Write { .. } => touch::WRITE,
                    _ => 0,
                };
                self.window(stmt, false, |b| {
                    Ok(
                        b.request(stmt, proc, request(&[op::TOUCH, start, len, step, flags]))?
                            .1,
                    )
                })?;
            }
            StmtKind::Fork { proc, child } => {
                self.forked.get_or_insert(stmt.pos.line);
                let mut forked = None;
                self.window(stmt, false, |b| {
                    let p = b.proc_mut(stmt, proc)?;
                    let (agent, reply) = p.agent.fork().map_err(|e| failed(stmt, e))?;
                    let faults = reply[3] + agent.hello_faults;
                    forked = Some(Proc {
                        agent,
                        regions: p.regions.clone(),
                        cursor: p.cursor,
                        minflt: 0,
                    });
                    Ok(faults)
                })?;
                if let Some(p) = forked {
                    self.procs.insert(child.clone(), p);
                }
            }
            StmtKind::ThpDisable { proc, on } => {
                let on = u64::from(*on);
                self.window(stmt, false, |b| {
                    Ok(b.request(stmt, proc, request(&[op::THP_DISABLE, on]))?.1)
                })?;
            }
            StmtKind::Exit { proc } => {
                // The regions go inside the window, as exit_mmap would take
                // them; the agent's own memory goes outside it.
                let regions: Vec<(u64, u64)> = self
                    .proc_mut(stmt, proc)?
                    .regions
                    .values()
                    .copied()
                    .collect();
                self.window(stmt, false, |b| {
                    let mut faults = 0;
                    for (start, len) in regions {
                        faults += b.request(stmt, proc, request(&[op::MUNMAP, start, len]))?.1;
                    }
                    Ok(faults)
                })?;
                if let Some(p) = self.procs.remove(proc) {
                    p.agent.exit().map_err(|e| failed(stmt, e))?;
                    rcu_settle(); // its own page tables, as after spawn
                }
            }
            StmtKind::Split { proc, range } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let pid = self.proc_mut(stmt, proc)?.agent.pid;
                self.window(stmt, false, |_| {
                    split_huge_pages(pid, start, start + len).map_err(|e| failed(stmt, e))?;
                    Ok(0)
                })?;
            }
            StmtKind::Pin { proc, range } | StmtKind::Unpin { proc, range } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let code = match stmt.kind {
                    StmtKind::Pin { .. } => op::PIN,
                    _ => op::UNPIN,
                };
                self.window(stmt, false, |b| {
                    Ok(b.request(stmt, proc, request(&[code, start, len]))?.1)
                })?;
            }
            StmtKind::Khugepaged => self.khugepaged(stmt)?,
            StmtKind::Reclaim => {
                // drop_caches=2 runs the slab shrinkers: the deferred split
                // queue and the under-used THP shrinker among them.
                self.window(stmt, false, |_| {
                    drop_slab().map_err(|e| failed(stmt, e))?;
                    Ok(0)
                })?;
            }
            StmtKind::Snapshot { .. } | StmtKind::Expect { .. } => {}
        }
        Ok(())
    }

    fn counters(&mut self) -> Result<Counters, BackendError> {
        let (counters, unknown) = self.observe()?;
        self.pending_unknown = unknown;
        Ok(counters)
    }

    fn unknown(&mut self) -> BTreeMap<String, String> {
        std::mem::take(&mut self.pending_unknown)
    }
}

impl Drop for KernelBackend {
    fn drop(&mut self) {
        // Agents first, so that hugetlb pages are free before pools shrink;
        // the guard restores the tunables when it drops after this.
        self.procs.clear();
        self.sentinel = None;
        self.cgroups.clear();
    }
}
