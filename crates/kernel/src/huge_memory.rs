//! `split` on the kernel: the debugfs `split_huge_pages` of
//! mm/huge_memory.c, for the agent's range.

use crate::agents::Agents;
use crate::call::{failed, Call};
use crate::error::KernelError;
use crate::measure::Measurement;
use hugelab_workload::stmt::Split;
use hugelab_workload::{BackendError, Errno, Stmt};

/// `split <proc> <range>`
pub(crate) fn split(
    m: &mut Measurement,
    agents: &mut Agents,
    stmt: &Stmt,
    s: &Split,
) -> Result<(), BackendError> {
    let (start, len) = agents.range(stmt, &s.proc, &s.range)?;
    let pid = agents.get_mut(stmt, &s.proc)?.agent.pid;
    m.window(stmt, false, agents, |_| {
        split_huge_pages(pid, start, start + len).map_err(|e| failed(stmt, e))?;
        Ok(Call::ok(0))
    })
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
            Errno(e.raw_os_error().unwrap_or(0))
        )),
        _ => KernelError::io(FILE, e),
    })
}
