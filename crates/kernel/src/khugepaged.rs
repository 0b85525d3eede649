//! khugepaged is kept from running on its own: a sentinel agent keeps one
//! (uncollapsible) mm registered, so a new registration does not wake it, and
//! its scan_sleep_millisecs is held at an hour. The `khugepaged` statement sets
//! the sleep to 0 until full_scans has moved twice (every registered mm
//! scanned completely), or returns at once when the PMD size is disabled and
//! the thread is not running.

use crate::agents::Agents;
use crate::call::{failed, req_ok, Call};
use crate::error::KernelError;
use crate::guard::SettingsGuard;
use crate::measure::Measurement;
use crate::process::AgentProc;
use crate::protocol::{Access, Request};
use crate::sysfs;
use hugelab_workload::units::{PAGE_SIZE, PMD_SIZE};
use hugelab_workload::{placement, BackendError, KhugepagedKnob, Stmt, ThpEnabled, Tunable};
use std::path::Path;
use std::time::{Duration, Instant};

/// khugepaged's sleep between passes while a workload runs.
const SCAN_SLEEP_HOLD: &str = "3600000";
/// How long a `khugepaged` statement may wait for two full scans.
const KHUGEPAGED_TIMEOUT: Duration = Duration::from_secs(60);

const SCAN_SLEEP: Tunable = Tunable::Khugepaged(KhugepagedKnob::ScanSleepMillisecs);

/// khugepaged held still for a workload: the sentinel process, and the
/// scan_sleep_millisecs it returns to after a `khugepaged` statement.
pub(crate) struct KhugepagedHold {
    /// The sentinel agent and the start of its two PMD ranges; None once
    /// stopped.
    sentinel: Option<(AgentProc, u64)>,
    /// The scan_sleep_millisecs khugepaged returns to after a `khugepaged`.
    scan_sleep: String,
}

impl KhugepagedHold {
    /// Holds the scan sleep at an hour (through the guard, which restores it)
    /// and starts the sentinel: a process whose one mm stays registered with
    /// khugepaged and can never be collapsed. Its PMD range was touched (so it
    /// has an anon_vma) and then emptied before MADV_HUGEPAGE, so every scan
    /// finds 512 none PTEs. `exe` is the `hugelab` binary.
    pub(crate) fn start(
        exe: &Path,
        guard: &mut SettingsGuard,
    ) -> Result<KhugepagedHold, KernelError> {
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
            scan_sleep: SCAN_SLEEP_HOLD.to_string(),
        };
        hold.register()?;
        Ok(hold)
    }

    /// MADV_HUGEPAGE on the sentinel: registers it whenever the PMD size is
    /// allowed (again after a `set` may have enabled it).
    pub(crate) fn register(&mut self) -> Result<(), KernelError> {
        if let Some((agent, addr)) = self.sentinel.as_mut() {
            let hugepage = Request::Madvise {
                addr: *addr,
                len: 2 * PMD_SIZE,
                advice: libc::MADV_HUGEPAGE,
            };
            req_ok(agent, hugepage)?;
        }
        Ok(())
    }

    /// The workload set scan_sleep_millisecs itself: khugepaged returns to
    /// that after a `khugepaged` statement, and may then run on its own,
    /// which the windows detect.
    pub(crate) fn set_scan_sleep(&mut self, value: &str) {
        self.scan_sleep = value.to_string();
    }

    /// The `khugepaged` statement, run inside its window (where collapse is
    /// expected): scans until full_scans has moved twice, then holds the
    /// sleep again. Call only while [`pmd_enabled`] (else the thread is not
    /// running and would never scan), after [`KhugepagedHold::register`].
    pub(crate) fn scan(
        &self,
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
        let hold = &self.scan_sleep;
        let start = read_scans()?;
        guard.set(&SCAN_SLEEP, "0").map_err(|e| failed(stmt, e))?;
        let deadline = Instant::now() + KHUGEPAGED_TIMEOUT;
        while read_scans()? < start + 2 {
            if Instant::now() > deadline {
                let _ = guard.set(&SCAN_SLEEP, hold);
                return Err(failed(
                    stmt,
                    format!("khugepaged did not finish two full scans in {KHUGEPAGED_TIMEOUT:?}"),
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        guard.set(&SCAN_SLEEP, hold).map_err(|e| failed(stmt, e))?;
        // Writing the sleep wakes khugepaged for one more pass; everything
        // collapsible is collapsed already, so it finds nothing, but let
        // it end inside this window.
        std::thread::sleep(Duration::from_millis(20));
        Ok(Call::ok(0))
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

/// hugepage_pmd_enabled() for anonymous memory, from the sysfs files.
pub(crate) fn pmd_enabled() -> bool {
    let pmd_kb = PMD_SIZE >> 10;
    match (sysfs::thp_size_enabled(pmd_kb), sysfs::thp_enabled()) {
        (Some(pmd), Some(top)) => pmd.resolve(top) != ThpEnabled::Never,
        _ => false,
    }
}
