//! khugepaged is kept from running on its own: a sentinel agent keeps one
//! (uncollapsible) mm registered, so a new registration does not wake it, and
//! its scan_sleep_millisecs is held at an hour. The `khugepaged` statement sets
//! the sleep to 0 until full_scans has moved twice (every registered mm
//! scanned completely), or returns at once when the PMD size is disabled and
//! the thread is not running.

use crate::agent::{op, touch};
use crate::backend::{failed, req_ok, Call, KernelBackend};
use crate::error::KernelError;
use crate::process::AgentProc;
use crate::sysfs;
use hugelab_workload::units::{PAGE_SIZE, PMD_SIZE};
use hugelab_workload::{placement, BackendError, KhugepagedKnob, Stmt, Tunable};
use std::time::{Duration, Instant};

/// khugepaged's sleep between passes while a workload runs.
pub(crate) const SCAN_SLEEP_HOLD: &str = "3600000";
/// How long a `khugepaged` statement may wait for two full scans.
const KHUGEPAGED_TIMEOUT: Duration = Duration::from_secs(60);

impl KernelBackend {
    /// A process whose one mm stays registered with khugepaged and can never
    /// be collapsed: its PMD range was touched (so it has an anon_vma) and then
    /// emptied before MADV_HUGEPAGE, so every scan finds 512 none PTEs.
    pub(crate) fn start_sentinel(&mut self) -> Result<(), KernelError> {
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
    pub(crate) fn register_sentinel(&mut self) -> Result<(), KernelError> {
        if let Some((agent, addr)) = self.sentinel.as_mut() {
            let advice = libc::MADV_HUGEPAGE as u64;
            req_ok(
                agent,
                [op::MADVISE, *addr, 2 * PMD_SIZE, advice, 0, 0, 0, 0],
            )?;
        }
        Ok(())
    }

    pub(crate) fn khugepaged(&mut self, stmt: &Stmt) -> Result<(), BackendError> {
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
            Ok(Call::ok(0))
        })
    }
}

/// hugepage_pmd_enabled() for anonymous memory, from the sysfs files.
pub(crate) fn pmd_enabled() -> bool {
    let top = sysfs::read_tunable(&Tunable::ThpEnabled).unwrap_or_default();
    let pmd = sysfs::read_tunable(&Tunable::ThpSizeEnabled { size_kb: 2048 }).unwrap_or_default();
    matches!(pmd.as_str(), "always" | "madvise") || (pmd == "inherit" && top != "never")
}
