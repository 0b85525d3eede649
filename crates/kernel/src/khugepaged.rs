//! khugepaged is kept from running on its own: a sentinel agent keeps one
//! mm registered, so a new registration does not wake it, and its
//! scan_sleep_millisecs is held at an hour. khugepaged then passes only when
//! the backend makes it: each write of scan_sleep_millisecs wakes it for
//! exactly one pass (`scan_sleep_millisecs_store` sets
//! `khugepaged_sleep_expire` to 0), after which it waits the held hour again.
//!
//! - `sleep`: the backend keeps the workload's clock as the model does (see
//!   the model's khugepaged_thread): a pass is due scan_sleep_millisecs (the
//!   workload's own value) after the last one, alloc_sleep_millisecs later
//!   when that pass backed off after a failed allocation. The runner sleeps
//!   for real and makes each due pass at its time, inside a measurement
//!   window, waiting for khugepaged to be back in its wait (its kernel stack)
//!   before going on. The scan cursor is khugepaged's own, carried from pass
//!   to pass.
//! - `set` of scan_sleep_millisecs or alloc_sleep_millisecs: the kernel
//!   wakes khugepaged for a pass; the backend keeps the hour in the file and
//!   the workload's value for its clock.
//! - `khugepaged`: pages_to_scan raised to its maximum for passes until
//!   full_scans has moved twice (every registered mm scanned to its end);
//!   such a pass always ends with the cursor at the list's head, where the
//!   model leaves it too. Nothing happens when the PMD size is disabled (the
//!   thread is not running).
//!
//! The sentinel's VMA is MADV_NOHUGEPAGE after its registration: a visit of
//! its mm costs 1 plus 1 per VMA (all passed over), as does each agent's own
//! VMAs, never a PMD range's 512. With pages_to_scan a multiple of 512 that
//! extra cost (below 512 a pass) cannot change how many ranges a pass scans;
//! otherwise it can, and every counter after such a pass is unknown (as it
//! is when `enabled` is `always` for the PMD size: any process on the
//! machine may then be registered and take part of the budget).

use crate::agents::Agents;
use crate::call::{failed, req_ok, Call};
use crate::error::KernelError;
use crate::guard::SettingsGuard;
use crate::measure::Measurement;
use crate::process::AgentProc;
use crate::protocol::{Access, Request};
use crate::sysfs;
use hugelab_workload::units::{HPAGE_PMD_NR, PAGE_SIZE, PMD_SIZE};
use hugelab_workload::{placement, BackendError, KhugepagedKnob, Stmt, ThpEnabled, Tunable};
use std::path::Path;
use std::time::{Duration, Instant};

/// khugepaged's sleep between passes while a workload runs.
const SCAN_SLEEP_HOLD: &str = "3600000";
/// pages_to_scan's largest value: a `khugepaged` statement's passes.
const PAGES_TO_SCAN_MAX: &str = "4294967295";
/// How long a `khugepaged` statement may wait for two full scans.
const KHUGEPAGED_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a pass may take beyond its alloc_sleep_millisecs back-off.
const PASS_TIMEOUT: Duration = Duration::from_secs(30);
const NS_PER_MS: u64 = 1_000_000;

const SCAN_SLEEP: Tunable = Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs);
const ALLOC_SLEEP: Tunable = Tunable::Khugepaged(KhugepagedKnob::AllocSleepMillisecs);
const PAGES_TO_SCAN: Tunable = Tunable::Khugepaged(KhugepagedKnob::PagesToScan);

/// khugepaged held still for a workload: the sentinel process, and the
/// workload's clock (see the module doc).
pub(crate) struct KhugepagedHold {
    /// The sentinel agent and the start of its two PMD ranges; None once
    /// stopped.
    sentinel: Option<(AgentProc, u64)>,
    /// The workload's scan_sleep_millisecs (the file holds an hour).
    scan_sleep_ms: u64,
    /// The workload's time, ns: the sum of its sleeps.
    now: u64,
    /// When the next pass is due, ns.
    next_pass: u64,
}

impl KhugepagedHold {
    /// Holds the scan sleep at an hour (through the guard, which restores it)
    /// and starts the sentinel: a process whose one mm stays registered with
    /// khugepaged. Its PMD range was touched (so it has an anon_vma) and then
    /// emptied before MADV_HUGEPAGE. `exe` is the `hugelab` binary.
    pub(crate) fn start(
        exe: &Path,
        guard: &mut SettingsGuard,
    ) -> Result<KhugepagedHold, KernelError> {
        let scan_sleep = sysfs::read_tunable(&SCAN_SLEEP)?;
        let scan_sleep_ms = scan_sleep.trim().parse().map_err(|_| {
            KernelError::Refused(format!(
                "scan_sleep_millisecs reads {scan_sleep:?}, not a number"
            ))
        })?;
        guard.set(&SCAN_SLEEP, SCAN_SLEEP_HOLD)?;
        let mut agent = AgentProc::spawn(exe)?;
        let mmap = Request::Mmap {
            addr: placement::place_region(&mut 0, 2 * PMD_SIZE, PMD_SIZE),
            len: 2 * PMD_SIZE,
            prot: libc::PROT_READ | libc::PROT_WRITE,
            shared: false,
            hugetlb: None,
            populate: false,
            stack: false,
            growsdown: false,
        };
        let addr = req_ok(&mut agent, mmap)? as u64;
        let touch = Request::Touch {
            addr,
            len: 1,
            step: PAGE_SIZE,
            access: Access::Write,
        };
        req_ok(&mut agent, touch)?;
        let dontneed = Request::Madvise {
            addr,
            len: PMD_SIZE,
            advice: libc::MADV_DONTNEED,
        };
        req_ok(&mut agent, dontneed)?;
        let mut hold = KhugepagedHold {
            sentinel: Some((agent, addr)),
            scan_sleep_ms,
            now: 0,
            next_pass: scan_sleep_ms * NS_PER_MS,
        };
        hold.register()?;
        Ok(hold)
    }

    /// MADV_HUGEPAGE on the sentinel: registers it whenever the PMD size is
    /// allowed (again after a `set` may have enabled it); then
    /// MADV_NOHUGEPAGE, so that khugepaged passes its VMA over (the mm stays
    /// registered until it exits).
    pub(crate) fn register(&mut self) -> Result<(), KernelError> {
        if let Some((agent, addr)) = self.sentinel.as_mut() {
            for advice in [libc::MADV_HUGEPAGE, libc::MADV_NOHUGEPAGE] {
                let madvise = Request::Madvise {
                    addr: *addr,
                    len: 2 * PMD_SIZE,
                    advice,
                };
                req_ok(agent, madvise)?;
            }
        }
        Ok(())
    }

    /// `set` of scan_sleep_millisecs or alloc_sleep_millisecs, inside its
    /// window: the write wakes khugepaged for a pass, which ends before
    /// this returns; scan_sleep_millisecs stays held in the file, the
    /// workload's value goes to the clock.
    pub(crate) fn sleep_store(
        &mut self,
        stmt: &Stmt,
        guard: &mut SettingsGuard,
        tunable: &Tunable,
        value: &str,
    ) -> Result<Call, BackendError> {
        let scan_sleep = *tunable == SCAN_SLEEP;
        if scan_sleep {
            self.scan_sleep_ms = value
                .parse()
                .map_err(|_| failed(stmt, format!("{value:?} is not a number")))?;
        }
        let written = if scan_sleep { SCAN_SLEEP_HOLD } else { value };
        let backed_off = if pmd_enabled() {
            pass(stmt, || guard.set(tunable, written))?
        } else {
            guard.set(tunable, written).map_err(|e| failed(stmt, e))?;
            false
        };
        self.next_pass =
            self.now + self.pass_time(stmt, backed_off)? + self.scan_sleep_ms * NS_PER_MS;
        Ok(Call::ok(0))
    }

    /// How long a pass took on the clock: alloc_sleep_millisecs when it
    /// backed off, else nothing.
    fn pass_time(&self, stmt: &Stmt, backed_off: bool) -> Result<u64, BackendError> {
        if !backed_off {
            return Ok(0);
        }
        let ms = sysfs::read_tunable(&ALLOC_SLEEP).map_err(|e| failed(stmt, e))?;
        let ms: u64 = ms
            .trim()
            .parse()
            .map_err(|_| failed(stmt, format!("alloc_sleep_millisecs reads {ms:?}")))?;
        Ok(ms * NS_PER_MS)
    }

    /// The `khugepaged` statement, run inside its window (where collapse is
    /// expected): passes with pages_to_scan at its maximum until full_scans
    /// has moved twice. Call only while [`pmd_enabled`] (else the thread is
    /// not running and would never scan), after [`KhugepagedHold::register`].
    pub(crate) fn scan(
        &mut self,
        stmt: &Stmt,
        guard: &mut SettingsGuard,
    ) -> Result<Call, BackendError> {
        let full_scans = sysfs::SYS_MM.to_string() + "/transparent_hugepage/khugepaged/full_scans";
        let read_scans = || -> Result<u64, BackendError> {
            sysfs::read_value(full_scans.as_ref())
                .map_err(|e| failed(stmt, e))?
                .parse()
                .map_err(|_| failed(stmt, format!("{full_scans}: not a number")))
        };
        let pages = sysfs::read_tunable(&PAGES_TO_SCAN).map_err(|e| failed(stmt, e))?;
        let start = read_scans()?;
        guard
            .set(&PAGES_TO_SCAN, PAGES_TO_SCAN_MAX)
            .map_err(|e| failed(stmt, e))?;
        let deadline = Instant::now() + KHUGEPAGED_TIMEOUT;
        let mut result = Ok(());
        while result.is_ok() && read_scans()? < start + 2 {
            if Instant::now() > deadline {
                result = Err(failed(
                    stmt,
                    format!("khugepaged did not finish two full scans in {KHUGEPAGED_TIMEOUT:?}"),
                ));
                break;
            }
            result = pass(stmt, || guard.set(&SCAN_SLEEP, SCAN_SLEEP_HOLD)).map(|_| ());
        }
        guard
            .set(&PAGES_TO_SCAN, pages.trim())
            .map_err(|e| failed(stmt, e))?;
        result?;
        self.next_pass = self.now + self.scan_sleep_ms * NS_PER_MS;
        Ok(Call::ok(0))
    }

    /// `sleep`: `ns` pass for real, and khugepaged makes each pass due in
    /// them at its time, each in a window of its own.
    pub(crate) fn sleep(
        &mut self,
        guard: &mut SettingsGuard,
        m: &mut Measurement,
        agents: &mut Agents,
        stmt: &Stmt,
        ns: u64,
    ) -> Result<(), BackendError> {
        let (began, start) = (Instant::now(), self.now);
        self.now += ns;
        if self.scan_sleep_ms == 0 {
            // khugepaged would scan without pause: one `khugepaged`.
            if ns > 0 {
                khugepaged(self, guard, m, agents, stmt)?;
            }
            self.next_pass = self.now;
            std::thread::sleep(Duration::from_nanos(ns).saturating_sub(began.elapsed()));
            return Ok(());
        }
        while self.next_pass <= self.now {
            let at = self.next_pass;
            std::thread::sleep(Duration::from_nanos(at - start).saturating_sub(began.elapsed()));
            let mut backed_off = false;
            if pmd_enabled() {
                if let Some(why) = self.inexact(agents) {
                    m.distrust_all(why);
                }
                m.window(stmt, true, agents, |_| {
                    backed_off = pass(stmt, || guard.set(&SCAN_SLEEP, SCAN_SLEEP_HOLD))?;
                    Ok(Call::ok(0))
                })?;
            }
            self.next_pass =
                at + self.pass_time(stmt, backed_off)? + self.scan_sleep_ms * NS_PER_MS;
        }
        std::thread::sleep(Duration::from_nanos(ns).saturating_sub(began.elapsed()));
        Ok(())
    }

    /// Why the passes of a sleep may scan other ranges than the model's,
    /// if they may: the kernel's pass also pays for the sentinel and for the
    /// agents' own VMAs (1 each a visit, twice at most in a pass), which the
    /// model does not have; that cannot change the count of 512-page ranges
    /// a pass scans only when pages_to_scan is a multiple of 512 and the
    /// extra stays below 512; and under `always` any process may take part
    /// of the budget.
    fn inexact(&self, agents: &Agents) -> Option<String> {
        let pages: u64 = sysfs::read_tunable(&PAGES_TO_SCAN)
            .ok()?
            .trim()
            .parse()
            .ok()?;
        if !pages.is_multiple_of(HPAGE_PMD_NR) {
            return Some(format!(
                "khugepaged passed with pages_to_scan {pages}, not a multiple of 512: the cost of the sentinel's and the agents' own VMAs (1 each a visit) may change how many PMD ranges a pass scans"
            ));
        }
        let top = sysfs::thp_enabled()?;
        if sysfs::thp_size_enabled(PMD_SIZE >> 10)
            .is_some_and(|v| v.resolve(top) == ThpEnabled::Always)
        {
            return Some("khugepaged passed while the PMD size was `always`: any process on the machine with an eligible VMA is registered and takes part of each pass's pages_to_scan".into());
        }
        let pids = self.sentinel.iter().map(|(a, _)| a.pid);
        let pids = pids.chain(agents.procs.values().map(|p| p.agent.pid));
        let vmas: u64 = pids
            .map(|pid| {
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                maps.lines().count() as u64 + 1
            })
            .sum();
        (2 * vmas >= HPAGE_PMD_NR).then(|| format!(
            "khugepaged passed over {vmas} VMAs and mms of the sentinel and agents: their cost (1 each, twice at most a pass) may reach 512 and change how many PMD ranges a pass scans"
        ))
    }

    /// Ends the sentinel (before the guard restores the settings).
    pub(crate) fn stop(&mut self) {
        self.sentinel = None;
    }
}

/// The `khugepaged` statement: returns at once when the PMD size is
/// disabled (the thread is not running: nothing collapses).
pub(crate) fn khugepaged(
    hold: &mut KhugepagedHold,
    guard: &mut SettingsGuard,
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
) -> Result<(), BackendError> {
    if !pmd_enabled() {
        return Ok(());
    }
    hold.register().map_err(|e| failed(stmt, e))?;
    m.window(stmt, true, agents, |_| hold.scan(stmt, guard))
}

/// One pass of khugepaged, which `wake` (a write of one of its sleeps)
/// starts: returns once khugepaged is back in its wait, and whether the
/// pass backed off after a failed allocation (thp_collapse_alloc_failed
/// moved).
fn pass(stmt: &Stmt, wake: impl FnOnce() -> Result<(), KernelError>) -> Result<bool, BackendError> {
    let err = |e: String| failed(stmt, e);
    let thread = Thread::find().map_err(err)?;
    let idle = thread.idle_top().map_err(err)?;
    let switches = thread.switches().map_err(err)?;
    let failed_before = alloc_failed().map_err(err)?;
    let alloc_sleep = sysfs::read_tunable(&ALLOC_SLEEP).map_err(|e| failed(stmt, e))?;
    let alloc_sleep = Duration::from_millis(alloc_sleep.trim().parse().unwrap_or(0));
    wake().map_err(|e| failed(stmt, e))?;
    let deadline = Instant::now() + alloc_sleep + PASS_TIMEOUT;
    while !(thread.switches().map_err(err)? > switches && thread.waiting_at(&idle)) {
        if Instant::now() > deadline {
            return Err(err(format!(
                "khugepaged did not end its pass in {:?}",
                alloc_sleep + PASS_TIMEOUT
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Ok(alloc_failed().map_err(err)? > failed_before)
}

/// thp_collapse_alloc_failed from /proc/vmstat.
fn alloc_failed() -> Result<u64, String> {
    let text = std::fs::read_to_string("/proc/vmstat").map_err(|e| format!("/proc/vmstat: {e}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix("thp_collapse_alloc_failed "))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| "/proc/vmstat has no thp_collapse_alloc_failed".to_string())
}

/// The khugepaged kernel thread, seen through /proc.
struct Thread {
    pid: i32,
}

impl Thread {
    /// The thread named khugepaged among kthreadd's children.
    fn find() -> Result<Thread, String> {
        let dir = std::fs::read_dir("/proc").map_err(|e| format!("/proc: {e}"))?;
        for entry in dir.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let t = Thread { pid };
            if t.stat()
                .is_some_and(|(comm, _, ppid)| comm == "khugepaged" && ppid == 2)
            {
                return Ok(t);
            }
        }
        Err("the khugepaged thread is not running".into())
    }

    /// Name, state and parent, from /proc/PID/stat.
    fn stat(&self) -> Option<(String, char, i32)> {
        let text = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        let (open, close) = (text.find('(')?, text.rfind(')')?);
        let mut rest = text[close + 1..].split_whitespace();
        let state = rest.next()?.chars().next()?;
        let ppid = rest.next()?.parse().ok()?;
        Some((text[open + 1..close].to_string(), state, ppid))
    }

    /// Its voluntary context switches: one at least at the end of a pass.
    fn switches(&self) -> Result<u64, String> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
        text.lines()
            .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| format!("{path} has no voluntary_ctxt_switches"))
    }

    /// The top of its kernel stack (the function it sleeps in and the
    /// offset: khugepaged_wait_work's wait is inlined into khugepaged()).
    fn top(&self) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{}/stack", self.pid)).ok()?;
        let line = text.lines().next()?;
        Some(line.split_whitespace().last()?.to_string())
    }

    /// Whether it sleeps at `idle`.
    fn waiting_at(&self, idle: &str) -> bool {
        self.stat().is_some_and(|(_, state, _)| state == 'S') && self.top().as_deref() == Some(idle)
    }

    /// Where it waits between passes: the top of its stack while it sleeps
    /// in khugepaged() itself (held, it waits there between the backend's
    /// passes), awaited for a while after the thread has just started.
    fn idle_top(&self) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(top) = self.top().filter(|t| t.starts_with("khugepaged+")) {
                if self.waiting_at(&top) {
                    return Ok(top);
                }
            }
            if Instant::now() > deadline {
                return Err("khugepaged is not waiting between passes".into());
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

// hugepage_pmd_enabled() for anonymous memory, from the sysfs files.
pub(crate) fn pmd_enabled() -> bool {
    let pmd_kb = PMD_SIZE >> 10;
    match (sysfs::thp_size_enabled(pmd_kb), sysfs::thp_enabled()) {
        (Some(pmd), Some(top)) => pmd.resolve(top) != ThpEnabled::Never,
        _ => false,
    }
}
