//! `set` on the kernel: the tunable journaled by the settings guard and
//! written inside a window (the kernel's store functions of sysfs and
//! /proc/sys/vm). Enabling the PMD size starts khugepaged, which then scans
//! at once: that pass ends before the next statement.

use crate::agents::Agents;
use crate::call::{failed, Call};
use crate::guard::SettingsGuard;
use crate::khugepaged::{pmd_enabled, KhugepagedHold};
use crate::measure::Measurement;
use crate::sysfs;
use hugelab_workload::stmt::Set;
use hugelab_workload::{BackendError, KhugepagedKnob, Stmt, Tunable};
use std::time::Duration;

/// `set <tunable> <value>`
pub(crate) fn set(
    guard: &mut SettingsGuard,
    khugepaged: &mut KhugepagedHold,
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Set,
) -> Result<(), BackendError> {
    let (tunable, value) = (&s.tunable, s.value.to_string());
    let pmd_before = pmd_enabled();
    guard.journal(tunable).map_err(|e| failed(stmt, e))?;
    if matches!(
        tunable,
        Tunable::Khugepaged(
            KhugepagedKnob::ScanSleepMillisecs | KhugepagedKnob::AllocSleepMillisecs
        )
    ) {
        // The write wakes khugepaged for a pass (see khugepaged.rs).
        m.window(stmt, true, agents, |_| {
            khugepaged.sleep_store(stmt, guard, tunable, &value)
        })?;
        return Ok(());
    }
    m.window(stmt, false, agents, |_| {
        guard.set(tunable, &value).map_err(|e| failed(stmt, e))?;
        Ok(Call::ok(0))
    })?;
    if !pmd_before && pmd_enabled() {
        // khugepaged just started and scans at once: let that pass end.
        khugepaged.register().map_err(|e| failed(stmt, e))?;
        std::thread::sleep(Duration::from_millis(100));
    }
    gigantic_pool_filled(stmt, tunable, &value)
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
