//! `KernelBackend`: the workload's statements on the real kernel.
//!
//! How a statement is measured. Every statement that acts on the machine runs
//! inside a *window*: the system-wide counters are folded (stat_refresh) and
//! read right before it and right after it, and the workload's system-wide
//! counters are the sum of the windows' changes. So the runner's own work
//! between statements, process start-up and the teardown of an agent's own
//! memory at exit are not counted; the model's machine, empty at the start,
//! reports the same quantities as absolute values. Hugetlb pool files are the
//! exception: they are reported as read (both sides start from the machine's
//! pools).
//!
//! What is not trusted:
//! - Another process faulting during a window (detected: the window's pgfault
//!   differs from the faults the agents themselves took) makes the
//!   system-wide counters after it unknown: all of them while a THP size is
//!   `always` (the other process may have got THPs too), else the
//!   anonymous-memory and page-table counters.
//! - THP collapse outside a `khugepaged` statement or MADV_COLLAPSE (khugepaged
//!   ran on its own) makes every counter after it unknown: the snapshot would
//!   not be stable.
//! - `fork` copies the agent's own memory and page tables, not only the
//!   regions': after a fork the anonymous-memory and page-table gauges are
//!   unknown.
//! - folios.* of a region are unknown when kpageflags read 0 for its pages.
//!
//! khugepaged is kept from running on its own: a sentinel agent keeps one
//! (uncollapsible) mm registered, so a new registration does not wake it, and
//! its scan_sleep_millisecs is held at an hour. The `khugepaged` statement sets
//! the sleep to 0 until full_scans has moved twice (every registered mm
//! scanned completely), or returns at once when the PMD size is disabled and
//! the thread is not running.

use crate::agent::{map, op, touch, Request, REQUEST_WORDS};
use crate::error::{errno_name, KernelError};
use crate::guard::SettingsGuard;
use crate::memcg::Memcg;
use crate::process::AgentProc;
use crate::vmstat::{is_absolute, SystemReader};
use crate::{pagemap, smaps, sysfs};
use hugelab_workload::{
    placement, Advice, Backend, BackendError, Counters, HugetlbSize, KhugepagedKnob, MachineParam,
    Prot, Range, Stmt, StmtKind, Tunable,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const BACKEND: &str = "kernel";
const PAGE_SIZE: u64 = 4096;
const PMD_SIZE: u64 = 2 << 20;
/// khugepaged's sleep between passes while a workload runs.
const SCAN_SLEEP_HOLD: &str = "3600000";
/// How long a `khugepaged` statement may wait for two full scans.
const KHUGEPAGED_TIMEOUT: Duration = Duration::from_secs(60);
const MADV_COLLAPSE: i32 = 25;

struct Proc {
    agent: AgentProc,
    regions: BTreeMap<String, (u64, u64)>,
    /// Where the next region goes (`placement::place_region`).
    cursor: u64,
    /// Faults taken by the workload's accesses (getrusage around the loop).
    minflt: i64,
}

pub struct KernelBackend {
    exe: PathBuf,
    guard: SettingsGuard,
    /// Two readers, so that the reading before a statement is parsed only
    /// after the reading after it.
    before: SystemReader,
    after: SystemReader,
    procs: BTreeMap<String, Proc>,
    sentinel: Option<(AgentProc, u64)>,
    /// Sum of the windows' changes, per system-wide counter.
    totals: Counters,
    /// Latest value of the counters reported as read.
    absolute: Counters,
    last: Option<Counters>,
    /// Reasons that made counters unknown, by scope.
    noise: Option<(String, bool)>,
    unstable: Option<String>,
    forked: Option<u32>,
    /// The scan_sleep_millisecs khugepaged returns to after a `khugepaged`.
    scan_sleep: String,
    /// What [`KernelBackend::observe`] found unknown, for `unknown()`.
    pending_unknown: BTreeMap<String, String>,
    cgroups: BTreeMap<String, Memcg>,
}

fn failed(stmt: &Stmt, e: impl std::fmt::Display) -> BackendError {
    BackendError::failed(stmt.pos, e.to_string())
}

impl KernelBackend {
    /// Takes the settings lock, quiets khugepaged and starts the sentinel.
    /// `exe` is the `hugelab` binary, run as `hugelab __agent` for each process.
    pub fn new(exe: PathBuf) -> Result<KernelBackend, KernelError> {
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

    /// A process whose one mm stays registered with khugepaged and can never
    /// be collapsed: its PMD range was touched (so it has an anon_vma) and then
    /// emptied before MADV_HUGEPAGE, so every scan finds 512 none PTEs.
    fn start_sentinel(&mut self) -> Result<(), KernelError> {
        let mut agent = AgentProc::spawn(&self.exe)?;
        let rw = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let addr = req_ok(
            &mut agent,
            [
                op::MMAP,
                placement::place_region(&mut 0, 2 * PMD_SIZE, PMD_SIZE),
                2 * PMD_SIZE,
                rw,
                0,
                0,
                0,
                0,
            ],
        )? as u64;
        req_ok(
            &mut agent,
            [op::TOUCH, addr, 1, PAGE_SIZE, touch::WRITE, 0, 0, 0],
        )?;
        let dontneed = libc::MADV_DONTNEED as u64;
        req_ok(
            &mut agent,
            [op::MADVISE, addr, PMD_SIZE, dontneed, 0, 0, 0, 0],
        )?;
        self.sentinel = Some((agent, addr));
        self.register_sentinel()
    }

    /// MADV_HUGEPAGE on the sentinel: registers it whenever the PMD size is
    /// allowed (again after a `set` may have enabled it).
    fn register_sentinel(&mut self) -> Result<(), KernelError> {
        if let Some((agent, addr)) = self.sentinel.as_mut() {
            let advice = libc::MADV_HUGEPAGE as u64;
            req_ok(
                agent,
                [op::MADVISE, *addr, 2 * PMD_SIZE, advice, 0, 0, 0, 0],
            )?;
        }
        Ok(())
    }

    /// Runs `f` inside a measurement window; `f` returns the faults the
    /// agents took, to compare with the system's pgfault.
    fn window(
        &mut self,
        stmt: &Stmt,
        collapse_allowed: bool,
        f: impl FnOnce(&mut Self) -> Result<i64, BackendError>,
    ) -> Result<(), BackendError> {
        let kerr = |e: KernelError| failed(stmt, e);
        // The runner's own faults around the two readings (first use of a
        // code path, heap growth) are not another process's: counted from
        // before the first reading to after the second, an upper bound.
        let runner_before = crate::agent::own_minflt();
        self.before.capture(false).map_err(kerr)?;
        let agent_faults = f(self)?;
        if frees_page_tables(&stmt.kind) {
            rcu_settle();
        }
        self.after.capture(true).map_err(kerr)?;
        let runner_faults = crate::agent::own_minflt() - runner_before;
        let before = self.before.parse().map_err(kerr)?;
        let after = self.after.parse().map_err(kerr)?;
        if let Some(last) = &self.last {
            if self.unstable.is_none() && collapsed(last, &before) {
                self.unstable = Some(format!(
                    "khugepaged collapsed memory on its own before line {}",
                    stmt.pos.line
                ));
            }
        }
        for (name, v) in &after {
            if is_absolute(name) {
                self.absolute.insert(name.clone(), *v);
            } else {
                *self.totals.entry(name.clone()).or_default() += v - before.get(name).unwrap_or(v);
            }
        }
        let sys_faults = after["vmstat.pgfault"] - before["vmstat.pgfault"];
        if std::env::var_os("HUGELAB_DEBUG_WINDOWS").is_some() {
            eprintln!(
                "window line {}: pgfault +{sys_faults} agents +{agent_faults} runner +{runner_faults} nr_anon_pages {:+} nr_page_table_pages {:+}",
                stmt.pos.line,
                after["vmstat.nr_anon_pages"] - before["vmstat.nr_anon_pages"],
                after["vmstat.nr_page_table_pages"] - before["vmstat.nr_page_table_pages"]
            );
        }
        let noisy = sys_faults > agent_faults + runner_faults;
        let wide = noisy && thp_always().unwrap_or(true);
        let narrower = self.noise.as_ref().is_some_and(|(_, w)| !w);
        if noisy && (self.noise.is_none() || (wide && narrower)) {
            self.noise = Some((
                format!(
                    "another process faulted during line {} (pgfault +{sys_faults}; the agents' own +{agent_faults}, the runner's +{runner_faults})",
                    stmt.pos.line
                ),
                wide,
            ));
        }
        if !collapse_allowed && self.unstable.is_none() && collapsed(&before, &after) {
            self.unstable = Some(format!(
                "khugepaged collapsed memory during line {}",
                stmt.pos.line
            ));
        }
        self.last = Some(after);
        Ok(())
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
        let offset = r.offset.map_or(0, |s| s.bytes());
        let n = r.len.map_or(len.saturating_sub(offset), |s| s.bytes());
        if offset.checked_add(n).is_none_or(|e| e > len) {
            return Err(failed(
                stmt,
                format!("range is outside region '{}'", r.region),
            ));
        }
        Ok((start + offset, n))
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

    fn khugepaged(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
        if !pmd_enabled() {
            return Ok(()); // the thread is not running: nothing collapses
        }
        self.register_sentinel().map_err(|e| failed(stmt, e))?;
        let sleep = Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs);
        let full_scans = sysfs::SYS_MM.to_string() + "/transparent_hugepage/khugepaged/full_scans";
        let read_scans = || -> Result<u64, BackendError> {
            sysfs::read_value(full_scans.as_ref())
                .map_err(|e| failed(stmt, e))?
                .parse()
                .map_err(|_| failed(stmt, format!("{full_scans}: not a number")))
        };
        let hold = self.scan_sleep.clone();
        self.window(stmt, true, |b| {
            let start = read_scans()?;
            b.guard.set(&sleep, "0").map_err(|e| failed(stmt, e))?;
            let deadline = Instant::now() + KHUGEPAGED_TIMEOUT;
            while read_scans()? < start + 2 {
                if Instant::now() > deadline {
                    let _ = b.guard.set(&sleep, &hold);
                    return Err(failed(
                        stmt,
                        format!(
                            "khugepaged did not finish two full scans in {KHUGEPAGED_TIMEOUT:?}"
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            b.guard.set(&sleep, &hold).map_err(|e| failed(stmt, e))?;
            // Writing the sleep wakes khugepaged for one more pass; everything
            // collapsible is collapsed already, so it finds nothing, but let
            // it end inside this window.
            std::thread::sleep(Duration::from_millis(20));
            Ok(0)
        })
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

/// Whether a statement may free page tables. Freed page tables leave
/// NR_PAGETABLE only in an RCU callback (MMU_GATHER_RCU_TABLE_FREE), after
/// the statement has returned: the reading after it must wait for that.
fn frees_page_tables(kind: &StmtKind) -> bool {
    matches!(
        kind,
        StmtKind::Munmap { .. }
            | StmtKind::Madvise { .. }
            | StmtKind::Exit { .. }
            | StmtKind::Khugepaged
            | StmtKind::Reclaim
            | StmtKind::Split { .. }
    )
}

/// Waits for two RCU grace periods (membarrier(MEMBARRIER_CMD_GLOBAL) is
/// synchronize_rcu), so that page tables freed by RCU callbacks queued before
/// now have left the counters. Best effort: a kernel without membarrier
/// gets a short sleep instead.
pub fn rcu_settle() {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    for _ in 0..2 {
        // SAFETY: membarrier takes no pointers.
        let rc = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
        if rc != 0 {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The callbacks run right after the grace period, from softirq or an
    // rcuo thread: give them a moment to finish.
    std::thread::sleep(Duration::from_millis(2));
}

/// Whether anything was collapsed between two readings.
fn collapsed(a: &Counters, b: &Counters) -> bool {
    ["vmstat.thp_collapse_alloc", "khugepaged.pages_collapsed"]
        .iter()
        .any(|k| a.get(*k) != b.get(*k))
}

/// hugepage_pmd_enabled() for anonymous memory, from the sysfs files.
fn pmd_enabled() -> bool {
    let top = sysfs::read_tunable(&Tunable::ThpEnabled).unwrap_or_default();
    let pmd = sysfs::read_tunable(&Tunable::ThpSizeEnabled { size_kb: 2048 }).unwrap_or_default();
    matches!(pmd.as_str(), "always" | "madvise") || (pmd == "inherit" && top != "never")
}

/// Whether some anonymous THP size is `always` (so any process faulting may get one).
fn thp_always() -> Option<bool> {
    let top = sysfs::read_tunable(&Tunable::ThpEnabled).ok()?;
    let dir = std::path::Path::new(sysfs::SYS_MM).join("transparent_hugepage");
    Some(sysfs::size_dirs(&dir).into_iter().any(|kb| {
        let v = sysfs::read_tunable(&Tunable::ThpSizeEnabled { size_kb: kb }).unwrap_or_default();
        v == "always" || (v == "inherit" && top == "always")
    }))
}

fn req_ok(agent: &mut AgentProc, req: Request) -> Result<i64, KernelError> {
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

fn request(words: &[u64]) -> Request {
    let mut r = [0u64; REQUEST_WORDS];
    r[..words.len()].copy_from_slice(words);
    r
}

impl Backend for KernelBackend {
    fn name(&self) -> &str {
        BACKEND
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
                    Ok(b.request(stmt, proc, request(&[op::MPROTECT, start, len, prot]))?.1)
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
                    Ok(b.request(stmt, proc, request(&[op::MADVISE, start, len, bits]))?.1)
                })?;
            }
            StmtKind::Read { proc, range, step } | StmtKind::Write { proc, range, step, .. } => {
                let (start, len) = self.range(stmt, proc, range)?;
                let step = step.map_or(PAGE_SIZE, |s| s.bytes().max(1));
                let flags = match &stmt.kind {
                    StmtKind::Write { zero: true, .. } => touch::WRITE | touch::ZERO,
                    StmtKind::Write { .. } => touch::WRITE,
                    _ => 0,
                };
                self.window(stmt, false, |b| {
                    Ok(b.request(stmt, proc, request(&[op::TOUCH, start, len, step, flags]))?.1)
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
                let regions: Vec<(u64, u64)> =
                    self.proc_mut(stmt, proc)?.regions.values().copied().collect();
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
            StmtKind::Split { .. } => {
                return Err(BackendError::unsupported(
                    stmt,
                    BACKEND,
                    "split (it needs debugfs split_huge_pages, which this kernel refuses under lockdown; split by a partial munmap and `reclaim` instead)",
                ))
            }
            StmtKind::Pin { .. } | StmtKind::Unpin { .. } => {
                return Err(BackendError::unsupported(stmt, BACKEND, "pin/unpin"))
            }
            StmtKind::Khugepaged => self.khugepaged(stmt)?,
            StmtKind::Reclaim => {
                // drop_caches=2 runs the slab shrinkers: the deferred split
                // queue and the under-used THP shrinker among them.
                self.window(stmt, false, |_| {
                    let path = std::path::Path::new(sysfs::PROC_VM).join("drop_caches");
                    sysfs::write_value(&path, "2").map_err(|e| failed(stmt, e))?;
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

impl KernelBackend {
    /// Every counter as of now, and those of them that cannot be trusted
    /// (removed from the first map, with the reason in the second).
    fn observe(&mut self) -> Result<(Counters, BTreeMap<String, String>), BackendError> {
        let mut c = self.totals.clone();
        c.extend(self.absolute.clone());
        for cg in self.cgroups.values() {
            c.extend(cg.counters().map_err(|e| BackendError::failed(Default::default(), e.to_string()))?);
        }
        let mut unknown = BTreeMap::new();
        let err = |e: KernelError| BackendError::failed(Default::default(), e.to_string());
        for (name, p) in &self.procs {
            let pid = p.agent.pid;
            c.insert(format!("stat.{name}.minflt"), p.minflt);
            let mut rollup = [0u64; 4];
            for (region, &(start, len)) in &p.regions {
                let s = smaps::region_smaps(pid, start, start + len).map_err(err)?;
                for (i, (field, kb)) in s.fields().into_iter().enumerate() {
                    c.insert(format!("smaps.{name}.{region}.{field}"), kb as i64);
                    rollup[i] += kb;
                }
                let f = pagemap::scan_folios(pid, start, start + len).map_err(err)?;
                for (order, n) in f.total.iter().enumerate() {
                    if order == 1 {
                        continue; // anonymous memory has no order-1 folios
                    }
                    let key = format!("folios.{name}.{region}.{}kB", 4 << order);
                    let pmd = if order == 9 { f.pmd_mapped } else { 0 };
                    c.insert(key.clone(), *n as i64);
                    c.insert(format!("{key}.pte"), (*n - pmd) as i64);
                    if order == 9 {
                        c.insert(format!("{key}.pmd"), pmd as i64);
                    }
                }
                if f.unknown_pages > 0 {
                    let why = format!(
                        "/proc/kpageflags read 0 for {} pages of {name}'s region {region}, so their folios are not known",
                        f.unknown_pages
                    );
                    let prefix = format!("folios.{name}.{region}.");
                    for k in c.keys().filter(|k| k.starts_with(&prefix)) {
                        unknown.insert(k.clone(), why.clone());
                    }
                }
            }
            // The rollup of the workload's own mappings: smaps_rollup also
            // holds the agent's memory, which is not the workload's.
            for (i, field) in ["Rss", "Pss", "Anonymous", "AnonHugePages"]
                .iter()
                .enumerate()
            {
                c.insert(format!("smaps.{name}.{field}"), rollup[i] as i64);
            }
        }
        for name in c.keys() {
            if let Some(why) = self.distrust(name) {
                unknown.entry(name.clone()).or_insert(why);
            }
        }
        c.retain(|k, _| !unknown.contains_key(k));
        Ok((c, unknown))
    }

    /// Why a system-wide counter cannot be trusted now, if it cannot.
    fn distrust(&self, name: &str) -> Option<String> {
        if let Some(why) = &self.unstable {
            return Some(why.clone());
        }
        let system = name.starts_with("vmstat.")
            || name.starts_with("mthp.")
            || (name.starts_with("meminfo.") && !is_absolute(name))
            || name.starts_with("khugepaged.");
        let anon_gauge = matches!(
            name,
            "vmstat.pgfault"
                | "vmstat.nr_anon_pages"
                | "vmstat.nr_page_table_pages"
                | "meminfo.AnonPages"
                | "meminfo.PageTables"
        );
        if let Some((why, wide)) = &self.noise {
            if system && (*wide || anon_gauge) {
                return Some(why.clone());
            }
        }
        let line = self
            .forked
            .filter(|_| anon_gauge && name != "vmstat.pgfault")?;
        Some(format!(
            "fork (line {line}) copied the agent's own memory and page tables too"
        ))
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
